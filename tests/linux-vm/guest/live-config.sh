# shellcheck shell=dash
# Guest side of jobs/live-config.sh: fio writes with verify at QD32 to LUN 0 while the host changes
# the target's configuration file (a refused file, then LUN 1 removed, LUN 2 added, the ACL
# changed). Then: a rescan shows LUN 2, which takes a write and reads it back; LUN 1 fails cleanly
# and its disk is deleted; fio saw no error, and a verify-only pass finds every acknowledged write.
# Handshake: out/fio-started (guest) when writes are under way, ./reload-done (host) when the host
# has applied the new file.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
# shellcheck source=open-iscsi-lib.sh
. ./open-iscsi-lib.sh
# shellcheck disable=SC1091 # written by the host job
. ./params.sh # PORT, IQN, GUEST_IQN
P=10.0.2.100:$PORT
echo "InitiatorName=$GUEST_IQN" >/etc/iscsi/initiatorname.iscsi
start_iscsid
node_new "$IQN" "$P"
check "login" login "$IQN" "$P"
dev=$(disk "$IQN" 0)
dev1=$(disk "$IQN" 1)
note "LUN 0 $dev, LUN 1 $dev1"
check "LUN 1 reads before the reload" dd if="$dev1" of=/dev/null bs=64k count=4 iflag=direct status=none

job=(--name=live --filename="$dev" --ioengine=libaio --direct=1 --iodepth=32 --rw=randwrite
    --bs=16k --size=192M --verify=crc32c --verify_fatal=1 --verify_state_save=1)
fio "${job[@]}" --do_verify=0 --output=out/fio-write.txt >/dev/null 2>&1 &
fio_pid=$!
writes_under_way "$dev"
note "writes under way; the host changes the configuration now"
for _ in $(seq 1 600); do
    [ -e reload-done ] && break
    kill -0 "$fio_pid" 2>/dev/null || fail "fio finished before the host's reloads were over (make the write pass larger)"
    sleep 0.2
done
[ -e reload-done ] || fail "the host did not finish its reloads"
ok "the host applied the new configuration while fio was writing"

# LUN 2 appears after a rescan (REPORTED LUNS DATA HAS CHANGED told the kernel; it rescans on ask).
iscsiadm -m session --rescan >/dev/null
dev2=$(disk "$IQN" 2)
check "LUN 2 appeared after the rescan ($dev2)" test -b "$dev2"
head -c 1048576 /dev/urandom >out/lun2.bin
check "LUN 2 takes a write" dd if=out/lun2.bin of="$dev2" bs=1M count=1 oflag=direct status=none
check "LUN 2 reads it back" sh -c "dd if=$dev2 bs=1M count=1 iflag=direct status=none | cmp - out/lun2.bin"

# LUN 1 is gone: the rescan's READ CAPACITY got LOGICAL UNIT NOT SUPPORTED (the disk shrinks to 0
# bytes), and a read of it fails or finds nothing, without a hang.
size1=$(blockdev --getsize64 "$dev1")
got=$(timeout 60 dd if="$dev1" bs=64k count=4 iflag=direct status=none 2>out/lun1.err | wc -c) || true
[ "$size1" = 0 ] || [ -s out/lun1.err ] || fail "LUN 1 still serves after its removal ($size1 bytes)"
[ "$got" = 0 ] || fail "LUN 1 gave $got bytes after its removal"
ok "LUN 1 is gone: $size1 bytes after the rescan, no data read"
echo 1 >"/sys/block/${dev1#/dev/}/device/delete"
check "LUN 1's disk deleted" test ! -e "$dev1"

write_pass_ended "$fio_pid" out/fio-write.txt "the reloads"
ok "fio wrote 192 MiB at QD32 across the reloads without an I/O error"
verify_only_pass out/fio-verify.txt "the reloads" "${job[@]}"
dmesg >out/dmesg.txt
grep -q 'LUN assignments on this target have changed\|reported luns data has changed' out/dmesg.txt \
    && ok "the kernel saw REPORTED LUNS DATA HAS CHANGED" || note "no 3F/0E line in the kernel log"
check "logout" logout "$IQN" "$P"
echo "LIVE CONFIG OK"
