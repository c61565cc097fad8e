#!/usr/bin/env bash
# A fence nobody sees (issue 48 item 1): one RBD gateway outside any gateway group serves an image
# of a one-node Ceph cluster that lives for this job only (scripts/ceph-dev, 127.0.0.1). In the
# guest, open-iscsi (no multipath) logs in and fio writes at QD32 with CRC32C verify; mid-run the
# host blocklists the gateway's RADOS client by hand (`ceph osd blocklist add`, the address of the
# image header's watcher), as a peer breaking its lock or a reservation change would. The gateway's
# writes fail with EBLOCKLISTED, its fence trips, and it rejoins with a new client; the commands
# that found it fenced end in BUSY (not NOT READY, LOGICAL UNIT COMMUNICATION FAILURE, which Linux's
# sd fails up as EIO), and the kernel sends them again. fio must see no error, the guest's kernel
# log no I/O error, and the verify-only pass every acknowledged write; the gateway's log must show
# the fence and the rejoin. About 2 min on 2 busy cores. Guest side: guest/fence-rejoin.sh.
# The gateway is $ISCSI_BIN itself, which loads librbd (installed by scripts/ceph-dev).
set -euo pipefail
# shellcheck source=tests/linux-vm/lib.sh
source "$(dirname "$0")/../lib.sh"
vm_setup
ceph_dir=$VM_WORK/ceph
# Ceph goes with the job whatever happens (its daemons killed by the PIDs they wrote), before the
# harness's own exit handling.
trap 'rc=$?; "$LINUX_VM_REPO/scripts/ceph-dev" stop "$ceph_dir" >/dev/null 2>&1 || true; _vm_exit $rc' EXIT
"$LINUX_VM_REPO/scripts/ceph-dev" start "$ceph_dir" >/dev/null
conf=$ceph_dir/ceph.conf
rbd -c "$conf" create rbd/fence --size 256M
iqn=iqn.2026-11.rs.iscsi.test:fence
port=$(vm_free_port)
target_start g1 "$port" --name "$iqn" --control none --lun "rbd:rbd/fence,conf=$conf"
echo "PORT=$port IQN=$iqn" >params.sh
guest=$LINUX_VM_DIR/guest
vm_run_bg --to-host "$port" --timeout 900 "$guest/fence-rejoin.sh" "$guest/open-iscsi-lib.sh" params.sh
vm_wait_file "$VM_SHARE/out/fio-started" 600 "$VM_RUN_PID" || {
    wait "$VM_RUN_PID" || true
    grep -E '^(ok|not ok) - ' console.log || true
    vm_fail "the guest did not start writing"
}
# The gateway's client: the watcher of the image's header (the gateway is its only user).
addrs=$(rbd -c "$conf" status rbd/fence | sed -n 's/.*watcher=\([^ ]*\) .*/\1/p' | sort -u)
[ -n "$addrs" ] || vm_fail "no watcher of rbd/fence: $(rbd -c "$conf" status rbd/fence 2>&1)"
for a in $addrs; do
    ceph -c "$conf" osd blocklist add "$a" >/dev/null 2>&1 || vm_fail "ceph osd blocklist add $a failed"
done
t0=$SECONDS
vm_log "blocklisted the gateway's client ($(echo "$addrs" | tr '\n' ' ')) under fio"
log=$(target_log g1)
until grep -q 'serving again' "$log"; do
    ((SECONDS - t0 < 60)) || vm_fail "the gateway did not rejoin within 60 s: $(tail -5 "$log")"
    target_alive g1 || vm_fail "the gateway died"
    sleep 0.2
done
vm_log "the gateway rejoined $((SECONDS - t0)) s or less after the blocklist"
touch "$VM_SHARE/fence-done"
rc=0
wait "$VM_RUN_PID" || rc=$?
grep -E '^(ok|not ok) - |^# ' console.log || true
[ "$rc" = 0 ] || vm_fail "guest script exit $rc"
grep -q '^FENCE OK' console.log || vm_fail "the guest did not finish"
target_alive g1 || vm_fail "the gateway died"
grep -q 'was blocklisted' "$log" || vm_fail "the gateway's log does not show the fence"
vm_log "pass: fio across the fence and the rejoin without an I/O error; every acknowledged write read back"
