# shellcheck shell=dash
# Guest side of jobs/power-cut.sh: `iscsi target` in the VM serving LUNs on the VM's own disks, which
# the host attaches with run --disk (written to the host's files, kept across boots):
#   /dev/vdb  ext4, three file LUNs: fua.img, sync.img, none.img (the host's load on each makes its
#             writes durable with FUA, with SYNCHRONIZE CACHE, or not at all)
#   /dev/vdc  a block LUN, buffered (page cache, flushed by FUA)
#   /dev/vdd  a block LUN, O_DIRECT (the disk's own write cache, flushed by FUA and SYNCHRONIZE CACHE)
# MODE=load (first boot): makes the file system, serves the LUNs, writes out/ready and waits: the
# host kills the VM (qemu, SIGKILL) in the middle of its writes, so the guest's page cache and
# everything not yet handed to the virtual disk is gone, as in a power cut.
# MODE=check (second boot): mounts the file system (ext4 replays its journal), serves the same LUNs,
# writes out/ready and waits for ./checked (the host's `iscsi verify --check` runs are over).
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
set -euo pipefail
# shellcheck source=scripts/lib/on-error.sh # put beside this script by tests/linux-vm/run
. ./on-error.sh
mkdir -p out
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# shellcheck disable=SC1091 # written by the host job
. ./params.sh # MODE, IQN
say() { echo "power-cut guest ($MODE): $*"; }

mkdir -p /mnt/data
if [ "$MODE" = load ]; then
    mkfs.ext4 -q -F /dev/vdb || { say "FAIL: mkfs.ext4 /dev/vdb"; exit 1; }
fi
mount -t ext4 /dev/vdb /mnt/data || { say "FAIL: mount /dev/vdb"; exit 1; }
say "mounted: $(dmesg | grep -E 'EXT4-fs \(vdb\)' | tail -2 | tr '\n' ' ')"
ls -ls /mnt/data >out/files-$MODE.txt

./iscsi target --listen 0.0.0.0:3260 --name "$IQN" \
    --lun file:/mnt/data/fua.img,size=16M --lun file:/mnt/data/sync.img,size=16M \
    --lun file:/mnt/data/none.img,size=16M --lun block:/dev/vdc --lun block:/dev/vdd,direct \
    >out/target-$MODE.log 2>&1 &
target=$!
for _ in $(seq 1 100); do
    (exec 3<>/dev/tcp/127.0.0.1/3260) 2>/dev/null && break
    kill -0 "$target" 2>/dev/null || { say "FAIL: the target exited"; tail -20 out/target-$MODE.log; exit 1; }
    sleep 0.2
done
touch out/ready
say "target up (PID $target)"

if [ "$MODE" = load ]; then
    # Nothing ends this boot but the host's kill; the job's timeout bounds it if the host never does.
    while :; do sleep 1; done
fi
for _ in $(seq 1 600); do
    [ -e ./checked ] && break
    sleep 0.5
done
kill -INT "$target"
wait "$target" || true
umount /mnt/data
[ -e ./checked ] || { say "FAIL: the host never finished its checks"; exit 1; }
say "done"
