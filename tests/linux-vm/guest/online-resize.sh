# shellcheck shell=dash
# Guest side of jobs/online-resize.sh: an ext4 on LUN 0 (256 MiB), mounted, fio writing a file with
# verify at QD32 while the host grows the LUN to 512 MiB by reload. Then: a rescan shows 512 MiB,
# resize2fs grows the mounted file system, a second fio pass writes a file the old space could not
# hold; after the host's refused shrinks, a remount, both files verify and fsck is clean.
# Handshake: out/fio-started (guest) when writes are under way, ./resize-done (host) when the LUN
# is grown, out/grown-fs (guest) when the file system is, ./shrink-refused (host).
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
# shellcheck source=open-iscsi-lib.sh
. ./open-iscsi-lib.sh
# shellcheck disable=SC1091 # written by the host job
. ./params.sh # PORT, IQN
P=10.0.2.100:$PORT
start_iscsid
node_new "$IQN" "$P"
check "login" login "$IQN" "$P"
dev=$(disk "$IQN" 0)
size0=$(blockdev --getsize64 "$dev")
[ "$size0" = 268435456 ] || fail "LUN 0 is $size0 bytes, not 256 MiB"
check "mkfs.ext4 on $dev" mkfs.ext4 -q -F "$dev"
mkdir -p /mnt/lun
check "mount" mount "$dev" /mnt/lun

old=(--name=old --filename=/mnt/lun/old.dat --ioengine=libaio --direct=1 --iodepth=32
    --rw=randwrite --bs=16k --size=160M --verify=crc32c --verify_fatal=1 --verify_state_save=1)
fio "${old[@]}" --do_verify=0 --output=out/fio-old.txt >/dev/null 2>&1 &
fio_pid=$!
writes_under_way "$dev"
note "writes under way; the host grows the LUN now"
for _ in $(seq 1 600); do
    [ -e resize-done ] && break
    kill -0 "$fio_pid" 2>/dev/null || fail "fio finished before the host grew the LUN (make the write pass larger)"
    sleep 0.2
done
[ -e resize-done ] || fail "the host did not grow the LUN"
write_pass_ended "$fio_pid" out/fio-old.txt "the growth"
ok "fio wrote 160 MiB at QD32 on ext4 across the growth without an I/O error"

# CAPACITY DATA HAS CHANGED told the kernel; the rescan reads the new capacity.
iscsiadm -m session --rescan >/dev/null
size1=0
for _ in $(seq 1 50); do
    size1=$(blockdev --getsize64 "$dev")
    [ "$size1" = 536870912 ] && break
    sleep 0.2
done
[ "$size1" = 536870912 ] || fail "after the rescan $dev is $size1 bytes, not 512 MiB"
ok "the rescan shows $dev at 512 MiB"
check "resize2fs grows the mounted file system online" resize2fs "$dev"
fs_bytes=$(df -B1 --output=size /mnt/lun | tail -1 | tr -d ' ')
[ "$fs_bytes" -gt 400000000 ] || fail "the file system is $fs_bytes bytes after resize2fs"
ok "the file system holds $fs_bytes bytes"
# 300 MiB beside the 160 MiB file: more than the old 256 MiB can hold, so it lands in the new space.
new=(--name=new --filename=/mnt/lun/new.dat --ioengine=libaio --direct=1 --iodepth=32
    --rw=randwrite --bs=64k --size=300M --verify=crc32c --verify_fatal=1 --verify_state_save=1)
if fio "${new[@]}" --do_verify=0 --output=out/fio-new.txt >/dev/null 2>&1; then
    ok "fio wrote 300 MiB more, into the grown space"
else
    tail -30 out/fio-new.txt
    fail "fio's write into the grown space"
fi
sync
touch out/grown-fs
for _ in $(seq 1 600); do
    [ -e shrink-refused ] && break
    sleep 0.2
done
[ -e shrink-refused ] || fail "the host did not try its shrinks"
[ "$(blockdev --getsize64 "$dev")" = 536870912 ] || fail "the disk changed size after a refused shrink"

check "umount" umount /mnt/lun
echo 3 >/proc/sys/vm/drop_caches
check "fsck finds the grown file system clean" e2fsck -fn "$dev"
check "mount again" mount "$dev" /mnt/lun
verify_only_pass out/fio-old-verify.txt "the growth (the file written across it)" "${old[@]}"
verify_only_pass out/fio-new-verify.txt "the growth (the file in the new space)" "${new[@]}"
dmesg >out/dmesg.txt
grep -qi 'capacity change\|capacity data has changed' out/dmesg.txt \
    && ok "the kernel saw the capacity change" || note "no capacity line in the kernel log"
check "umount" umount /mnt/lun
check "logout" logout "$IQN" "$P"
echo "ONLINE RESIZE OK"
