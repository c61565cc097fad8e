#!/usr/bin/env bash
# Persistent reservations across two RBD gateways with the Linux kernel initiator and sg3-utils
# (issue 36 step 5): two `iscsi target` gateways on the host (--target-port-id 1 and 2) serve one
# RBD image of a one-node Ceph cluster that lives for this job only (scripts/ceph-dev, 127.0.0.1);
# their reservations are shared through the image's RADOS record. The guest logs in as two
# initiators (two open-iscsi ifaces with their own names): A through gateway 1, B through both.
# A registers and reserves (Write Exclusive, Registrants Only); both gateways report the same keys
# and reservation; B's writes, unregistered, get RESERVATION CONFLICT through either gateway. The
# host SIGSTOPs gateway 1, A writes through it (the writes hang), B's PREEMPT AND ABORT through
# gateway 2 must complete (gateway 2 fences gateway 1 first), gateway 1 gets SIGCONT: A's writes
# fail and none of them is on the image (read back by B and by `rbd export` here), B's own write is.
# Gateway 1 then rejoins by itself with a new RADOS client: the preemption it missed is in force
# through it (A conflicts), B registers through it and writes.
# The same proof as crates/cli/tests/rbd_pr.rs with our initiator. No --gateway-group: with ALUA the
# standby gateway would answer writes NOT READY (standby) before any reservation check.
# Handshake through the share: the guest writes out/stop-gw1 and out/cont-gw1, the host answers
# ./gw1-stopped and ./gw1-continued. Guest side: guest/pr-two-gateways.sh.
# The gateways are $ISCSI_BIN itself, which loads librbd (installed by scripts/ceph-dev) when the
# rbd: LUN opens.
set -euo pipefail
# shellcheck source=tests/linux-vm/lib.sh
source "$(dirname "$0")/../lib.sh"
vm_setup
ceph_dir=$VM_WORK/ceph
# Ceph goes with the job whatever happens (its daemons killed by the PIDs they wrote), before the
# harness's own exit handling. A gateway left stopped is continued first, so that it can be ended.
trap 'rc=$?; [ -n "$(target_pid g1)" ] && kill -CONT "$(target_pid g1)" 2>/dev/null; "$LINUX_VM_REPO/scripts/ceph-dev" stop "$ceph_dir" >/dev/null 2>&1 || true; _vm_exit $rc' EXIT
"$LINUX_VM_REPO/scripts/ceph-dev" start "$ceph_dir" >/dev/null
conf=$ceph_dir/ceph.conf
rbd -c "$conf" create rbd/pr --size 64M
iqn=iqn.2026-11.rs.iscsi.test:pr
gateway() { echo --name "$iqn" --control none --target-port-id "$1" --lun "rbd:rbd/pr,conf=$conf"; }
port1=$(vm_free_port)
# shellcheck disable=SC2046 # the words of gateway's line, none with spaces
target_start g1 "$port1" $(gateway 1)
port2=$(vm_free_port)
# shellcheck disable=SC2046
target_start g2 "$port2" $(gateway 2)
echo "PORT1=$port1 PORT2=$port2 IQN=$iqn" >params.sh
guest=$LINUX_VM_DIR/guest
vm_run_bg --to-host "$port1" --to-host "$port2" --timeout 900 \
    "$guest/pr-two-gateways.sh" "$guest/open-iscsi-lib.sh" params.sh
g1=$(target_pid g1)
vm_wait_file "$VM_SHARE/out/stop-gw1" 600 "$VM_RUN_PID" || { wait "$VM_RUN_PID" || true; grep -E '^(ok|not ok) - ' console.log || true; vm_fail "the guest did not reserve"; }
vm_log "SIGSTOP to gateway 1 (PID $g1)"
process_stop "$g1"
touch "$VM_SHARE/gw1-stopped"
vm_wait_file "$VM_SHARE/out/cont-gw1" 600 "$VM_RUN_PID" || { wait "$VM_RUN_PID" || true; grep -E '^(ok|not ok) - ' console.log || true; vm_fail "the guest did not preempt"; }
vm_log "SIGCONT to gateway 1"
kill -CONT "$g1"
touch "$VM_SHARE/gw1-continued"
rc=0
wait "$VM_RUN_PID" || rc=$?
grep -E '^(ok|not ok) - |^# ' console.log || true
[ "$rc" = 0 ] || vm_fail "guest script exit $rc"
grep -q '^PR OK' console.log || vm_fail "the guest did not finish"
target_alive g2 || vm_fail "gateway 2 died"
# The image itself, past both gateways: A's write as holder (LBA 8, 0x11), nothing of B's
# conflicting writes (LBA 9), B's write after the preemption (LBA 10, 0x33), none of A's writes
# through the stopped gateway (LBAs 100-107, 0x44).
for g in g1 g2; do target_stop "$g"; done
rbd -c "$conf" export rbd/pr image.raw >/dev/null 2>&1
# blocks_are LBA COUNT BYTE: the COUNT 512-byte blocks at LBA of image.raw are all BYTE (hex).
blocks_are() {
    cmp -s <(dd if=image.raw bs=512 skip="$1" count="$2" status=none) \
        <(head -c $(($2 * 512)) /dev/zero | tr '\0' "\\$(printf '%03o' "0x$3")")
}
blocks_are 8 1 11 || vm_fail "rbd export: LBA 8 is not A's 0x11"
blocks_are 9 1 00 || vm_fail "rbd export: B's conflicting write landed at LBA 9"
blocks_are 10 1 33 || vm_fail "rbd export: LBA 10 is not B's 0x33"
blocks_are 100 8 00 || vm_fail "rbd export: a write through the stopped gateway landed (LBAs 100-107)"
blocks_are 11 1 55 || vm_fail "rbd export: LBA 11 is not B's 0x55 (written through the rejoined gateway 1)"
echo "ok - rbd export: LBA 8 = 0x11, LBA 9 = 0, LBA 10 = 0x33, LBA 11 = 0x55, LBAs 100-107 = 0"
# at WHAT: the time of gateway 1's first log line matching WHAT.
at() { sed 's/\x1b\[[0-9;]*m//g' "$(target_log g1)" | grep -m1 -- "$1" | grep -Eo 'T[0-9:.]+' | head -1 | tr -d T; }
[ -n "$(at 'serving again')" ] || vm_fail "gateway 1's log does not say it rejoined"
vm_log "gateway 1: fenced at $(at 'was blocklisted'), rejoined at $(at 'serving again')"
vm_log "pass: $(grep -o 'preempt took .*' console.log | head -1)"
