#!/usr/bin/env bash
# Our initiator's multipath set as a Linux disk (issue 48 item 4): two `iscsi target` gateways on
# the host (--gateway-group 1,2, implicit ALUA) serve one RBD image of a one-node Ceph cluster that
# lives for this job only; in the guest, `iscsi attach URL1 URL2` makes one ublk device over both.
# fio writes at QD32 with CRC32C verify; the host SIGKILLs the owner (the gateway the image header
# names) mid-run: fio must see no error, a verify-only pass must find every acknowledged write, and
# the guest prints the time from the kill to the first write the device completed after it. The
# killed gateway is started again; the attach's log must say its path works again. About 2 min.
# Guest side: guest/ublk-multipath.sh. ublk_drv is in the image of build-ublk-image (6.12).
set -euo pipefail
# shellcheck source=tests/linux-vm/lib.sh
source "$(dirname "$0")/../lib.sh"
image=$("$LINUX_VM_DIR/build-ublk-image")
vm_setup
ceph_dir=$VM_WORK/ceph
trap 'rc=$?; "$LINUX_VM_REPO/scripts/ceph-dev" stop "$ceph_dir" >/dev/null 2>&1 || true; _vm_exit $rc' EXIT
"$LINUX_VM_REPO/scripts/ceph-dev" start "$ceph_dir" >/dev/null
rbd -c "$ceph_dir/ceph.conf" create rbd/ublk-mp --size 256M
iqn=iqn.2026-11.rs.iscsi.test:ublk-mp
gateway() { echo --name "$iqn" --control none --target-port-id "$1" --gateway-group 1,2 --lun "rbd:rbd/ublk-mp,conf=$ceph_dir/ceph.conf"; }
port1=$(vm_free_port)
# shellcheck disable=SC2046 # the words of gateway's line, none with spaces
target_start g1 "$port1" $(gateway 1)
port2=$(vm_free_port)
# shellcheck disable=SC2046
target_start g2 "$port2" $(gateway 2)
echo "PORT1=$port1 PORT2=$port2 IQN=$iqn" >params.sh
cp "$ISCSI_BIN" ./iscsi
# --to-host-retry: a killed gateway looks to the guest like a host that does not answer yet.
vm_run_bg --image "$image" --to-host-retry "$port1" --to-host-retry "$port2" --timeout 900 \
    "$LINUX_VM_DIR/guest/ublk-multipath.sh" "$LINUX_VM_DIR/guest/open-iscsi-lib.sh" params.sh ./iscsi

vm_wait_file "$VM_SHARE/out/writing" 600 "$VM_RUN_PID" || { wait "$VM_RUN_PID" || true; vm_fail "the guest did not start writing"; }
# (stderr aside: a client's admin socket clashes with the gateways' in the job's run directory.)
header=rbd_header.$(rbd -c "$ceph_dir/ceph.conf" info rbd/ublk-mp --format json 2>/dev/null | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])')
owner=$(rados -c "$ceph_dir/ceph.conf" -p rbd getxattr "$header" iscsi-rs.owner 2>/dev/null)
case $owner in
    1) killed=g1 ;;
    2) killed=g2 ;;
    *) vm_fail "the image header names '$owner' as the owner" ;;
esac
vm_kill_then_restart "$killed"
rc=0
wait "$VM_RUN_PID" || rc=$?
rm -f ./iscsi
results=${LINUX_VM_RESULTS:-$LINUX_VM_REPO/target/linux-vm-results}/ublk-multipath
mkdir -p "$results"
rm -rf "${results:?}"/*
[ -d "$VM_SHARE/out" ] && cp -r "$VM_SHARE/out/." "$results/"
grep -E '^(ok|not ok) - |^# ' console.log || true
[ "$rc" = 0 ] || vm_fail "guest script exit $rc"
grep -q '^UBLK MULTIPATH OK' console.log || vm_fail "the guest did not finish"
for g in g1 g2; do target_alive "$g" || vm_fail "gateway $g died"; done
vm_log "pass: $(grep -o 'failover: .*' console.log | head -1)"
