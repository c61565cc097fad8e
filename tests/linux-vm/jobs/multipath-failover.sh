#!/usr/bin/env bash
# dm-multipath over a gateway group (issue 36 step 5): two `iscsi target` gateways on the host
# (--gateway-group 1,2, implicit ALUA, the owner = the holder of the RBD image's exclusive lock)
# serve one RBD image of a one-node Ceph cluster that lives for this job only (scripts/ceph-dev,
# 127.0.0.1). In the guest, open-iscsi logs in to both and dm-multipath joins the two disks;
# fio writes at QD32 with CRC32C verify; the owner is SIGKILLed mid-run: fio must see no error, a
# verify-only pass must find every acknowledged write, and the guest prints the time from the kill
# to the first write completed through the survivor. The killed gateway is started again and its
# path must return within 120 s, the two paths then one ready (active/optimized) and one ghost
# (standby); the guest prints the time from the restart to the return. MPATH_KILLS=N does all of
# it N times (the failovers' distribution). About 1.5-2.5 min on 2 busy cores for one kill.
# Guest side: guest/multipath-failover.sh.
# The gateways are $ISCSI_BIN itself, which loads librbd (installed by scripts/ceph-dev) when the
# rbd: LUN opens.
# multipathd is in the image of build-ublk-image only (bookworm-backports' 6.12), which this job
# boots.
set -euo pipefail
# shellcheck source=tests/linux-vm/lib.sh
source "$(dirname "$0")/../lib.sh"
image=$("$LINUX_VM_DIR/build-ublk-image")
vm_setup
ceph_dir=$VM_WORK/ceph
# Ceph goes with the job whatever happens (its daemons killed by the PIDs they wrote), before the
# harness's own exit handling.
trap 'rc=$?; "$LINUX_VM_REPO/scripts/ceph-dev" stop "$ceph_dir" >/dev/null 2>&1 || true; _vm_exit $rc' EXIT
"$LINUX_VM_REPO/scripts/ceph-dev" start "$ceph_dir" >/dev/null
rbd -c "$ceph_dir/ceph.conf" create rbd/mpath --size 256M
port1=$(vm_free_port)
iqn=iqn.2026-11.rs.iscsi.test:mpath
gateway() { echo --name "$iqn" --control none --target-port-id "$1" --gateway-group 1,2 --lun "rbd:rbd/mpath,conf=$ceph_dir/ceph.conf"; }
# shellcheck disable=SC2046 # the words of gateway's line, none with spaces
target_start g1 "$port1" $(gateway 1)
port2=$(vm_free_port)
# shellcheck disable=SC2046
target_start g2 "$port2" $(gateway 2)
# MPATH_KILLS: how many times the owner is killed (each a write pass with its verify, the restart and
# the path's return; about 40 s each); the guest prints the failovers' min, median and max.
rounds=${MPATH_KILLS:-1}
echo "PORT1=$port1 PORT2=$port2 IQN=$iqn ROUNDS=$rounds" >params.sh
guest=$LINUX_VM_DIR/guest
# --to-host-retry: a stopped gateway looks to the guest like a host that does not answer yet, not
# like one that accepts and closes at once, which leaves open-iscsi 2.1.8 unable to log in again
# (see tests/linux-vm/run).
vm_run_bg --image "$image" --systemd --to-host-retry "$port1" --to-host-retry "$port2" --timeout $((600 + 60 * rounds)) \
    "$guest/multipath-failover.sh" "$guest/open-iscsi-lib.sh" params.sh

for r in $(seq 1 "$rounds"); do
    vm_wait_file "$VM_SHARE/out/kill-target.$r" 600 "$VM_RUN_PID" || { wait "$VM_RUN_PID" || true; vm_fail "the guest did not start writing (round $r)"; }
    owner=$(cat "$VM_SHARE/out/kill-target.$r")
    case $owner in
        "$port1") killed=g1 ;;
        "$port2") killed=g2 ;;
        *) vm_fail "the guest names port '$owner' as the owner's" ;;
    esac
    vm_kill_then_restart "$killed" "$r"
done
rc=0
wait "$VM_RUN_PID" || rc=$?
results=${LINUX_VM_RESULTS:-$LINUX_VM_REPO/target/linux-vm-results}/multipath-failover
mkdir -p "$results"
rm -rf "${results:?}"/*
[ -d "$VM_SHARE/out" ] && cp -r "$VM_SHARE/out/." "$results/"
cp "$VM_WORK"/target-*.log "$results/" 2>/dev/null || true
grep -E '^(ok|not ok) - |^# ' console.log || true
[ "$rc" = 0 ] || vm_fail "guest script exit $rc"
grep -q '^MULTIPATH OK' console.log || vm_fail "the guest did not finish"
for g in g1 g2; do target_alive "$g" || vm_fail "gateway $g died"; done
vm_log "pass: $(grep -o 'failover: .*' console.log | head -1); $(grep -o 'MULTIPATH OK .*' console.log | head -1)"
