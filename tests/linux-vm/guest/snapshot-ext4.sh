# shellcheck shell=dash
# Guest side of jobs/snapshot-ext4.sh: an ext4 on LUN 0 (RAM, 256 MiB), mounted, with fio writing
# a file with verify at QD32 and a loop creating, fsyncing, renaming and removing small files while
# the host takes three snapshots; then unmounted, and a fourth snapshot taken. Once the host serves
# them (LUNs 1-3 the busy snapshots read-only, 4-6 their clones, 7 the quiet one), a rescan, and:
# the snapshots are write protected; each clone mounts (journal replayed) and is fsck-clean after;
# the quiet snapshot is fsck-clean as it is and holds LUN 0's fio file byte for byte.
# Handshake: out/fio-started (guest), ./snapshots-taken (host), out/quiet (guest, unmounted),
# ./snapshots-served (host).
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
check "mkfs.ext4 on $dev" mkfs.ext4 -q -F "$dev"
mkdir -p /mnt/lun
check "mount" mount "$dev" /mnt/lun

busy=(--name=busy --filename=/mnt/lun/busy.dat --ioengine=libaio --direct=1 --iodepth=32
    --rw=randwrite --bs=16k --size=96M --verify=crc32c --verify_fatal=1 --verify_state_save=1)
fio "${busy[@]}" --do_verify=0 --output=out/fio-busy.txt >/dev/null 2>&1 &
fio_pid=$!
# Metadata in flight too: the journal busy when the snapshots are taken.
mkdir -p /mnt/lun/churn
(
    i=0
    while [ ! -e snapshots-taken ]; do
        i=$((i + 1))
        echo "file $i" >"/mnt/lun/churn/new-$i"
        sync -d "/mnt/lun/churn/new-$i" 2>/dev/null || sync
        mv "/mnt/lun/churn/new-$i" "/mnt/lun/churn/kept-$i"
        [ $((i % 3)) = 0 ] && rm -f "/mnt/lun/churn/kept-$((i - 1))"
    done
    echo "$i" >out/churned
) &
churn_pid=$!
writes_under_way "$dev"
note "writes under way; the host takes snapshots now"
for _ in $(seq 1 600); do
    [ -e snapshots-taken ] && break
    sleep 0.2
done
[ -e snapshots-taken ] || fail "the host did not take its snapshots"
wait "$churn_pid" || fail "the metadata loop failed"
write_pass_ended "$fio_pid" out/fio-busy.txt "three snapshots"
ok "fio and $(cat out/churned) file creations ran across three snapshots without an I/O error"
check "umount" umount /mnt/lun
touch out/quiet
for _ in $(seq 1 600); do
    [ -e snapshots-served ] && break
    sleep 0.2
done
[ -e snapshots-served ] || fail "the host did not serve the snapshots"
iscsiadm -m session --rescan >/dev/null
mkdir -p /mnt/snap /mnt/live

for lun in 1 2 3; do
    snap=$(disk "$IQN" "$lun")
    ro=$(blockdev --getro "$snap")
    [ "$ro" = 1 ] || fail "snapshot LUN $lun ($snap) is not read-only to the kernel"
    if dd if=/dev/zero of="$snap" bs=4k count=1 oflag=direct 2>/dev/null; then
        fail "a write to snapshot LUN $lun succeeded"
    fi
    ok "snapshot LUN $lun ($snap) is write protected"
done
for lun in 4 5 6; do
    clone=$(disk "$IQN" "$lun")
    # The kernel replays the journal, as after a power cut at the snapshot's moment.
    check "clone LUN $lun mounts (its journal replayed)" mount "$clone" /mnt/snap
    [ -d /mnt/snap/churn ] && [ -e /mnt/snap/busy.dat ] || fail "clone LUN $lun lacks the files"
    echo "written on the clone" >/mnt/snap/clone-note
    check "umount clone LUN $lun" umount /mnt/snap
    check "e2fsck finds clone LUN $lun clean after the replay" e2fsck -fn "$clone"
done
dmesg >out/dmesg.txt
replayed=$(grep -c 'recovery complete' out/dmesg.txt || true)
note "the kernel replayed a journal on $replayed of the 3 clones (a snapshot of a busy ext4 needs it)"
quiet=$(disk "$IQN" 7)
check "e2fsck finds the quiet snapshot clean as it is" e2fsck -fn "$quiet"
check "mount LUN 0" mount -o ro "$dev" /mnt/live
check "mount the quiet snapshot" mount -o ro "$quiet" /mnt/snap
check "the quiet snapshot holds LUN 0's fio file byte for byte" cmp /mnt/live/busy.dat /mnt/snap/busy.dat
check "umount" umount /mnt/snap
check "umount" umount /mnt/live
check "logout" logout "$IQN" "$P"
echo "SNAPSHOT EXT4 OK"
