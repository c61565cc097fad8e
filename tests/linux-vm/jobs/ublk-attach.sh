#!/usr/bin/env bash
# `iscsi attach` / `iscsi detach`: our initiator as a Linux block device through ublk, in the guest,
# against `iscsi target` on the host: mkfs, a tree copied and checked, fsck, fio verify at QD32,
# detach and attach again with the data intact, a second attach refused, the target killed while
# attached (I/O errors within --timeout, detach still works), and a side-by-side fio table against
# open-iscsi on a second target. Guest side: guest/ublk-attach.sh.
# ublk_drv needs Linux 6.0+ built with CONFIG_BLK_DEV_UBLK: the default image's Debian 12 kernel
# (6.1) lacks it, so this job boots its own image with bookworm-backports' 6.12
# (build-ublk-image says which: by default /var/cache/iscsi-rs-linux-vm-6.12), built when missing
# (scripts/linux-vm-tests readies it before the first job; run alone, the job does).
set -euo pipefail
# shellcheck source=tests/linux-vm/lib.sh
source "$(dirname "$0")/../lib.sh"
image=$("$LINUX_VM_DIR/build-ublk-image")
vm_setup
port=$(vm_free_port)
iqn=iqn.2026-11.rs.iscsi.test:ublk
target_start t0 "$port" --name "$iqn" --lun "file:$VM_WORK/ublk.img,size=512M"
port2=$(vm_free_port)
iqn2=iqn.2026-11.rs.iscsi.test:ublk-bench
target_start t1 "$port2" --name "$iqn2" --lun ram:512M
# BENCH_ROUNDS: rounds of the side-by-side bench (1; medians over them, for a measurement: 3).
echo "PORT=$port IQN=$iqn PORT2=$port2 IQN2=$iqn2 ATTACH_RUST_LOG=${ATTACH_RUST_LOG:-info} BENCH_ROUNDS=${BENCH_ROUNDS:-1}" >params.sh
cp "$ISCSI_BIN" ./iscsi
guest=$LINUX_VM_DIR/guest
# Plain --to-host: the killed target ($port) serves only our initiator, which is not subject to
# open-iscsi 2.1.8's reopen bug and must see a dead target fail fast (not a 10 s retrying forward);
# open-iscsi uses $port2, whose target is never stopped.
vm_run_bg --image "$image" --to-host "$port" --to-host "$port2" --timeout 900 \
    "$guest/ublk-attach.sh" "$guest/open-iscsi-lib.sh" params.sh ./iscsi

vm_wait_file "$VM_SHARE/out/kill-target" 600 "$VM_RUN_PID" || { wait "$VM_RUN_PID" || true; vm_fail "the guest did not reach the bad case"; }
vm_log "SIGKILL to the target (PID $(target_pid t0)) under the attached device"
target_kill t0
touch "$VM_SHARE/target-killed"
rc=0
wait "$VM_RUN_PID" || rc=$?
rm -f ./iscsi
# Every step's output (attach logs, fio, the side-by-side table) in $LINUX_VM_RESULTS/ublk-attach/.
results=${LINUX_VM_RESULTS:-$LINUX_VM_REPO/target/linux-vm-results}/ublk-attach
mkdir -p "$results"
rm -rf "${results:?}"/*
[ -d "$VM_SHARE/out" ] && cp -r "$VM_SHARE/out/." "$results/"
cp console.log "$results/console.log"
grep -E '^(ok|not ok) - |^# ' console.log || true
sed -n '/^side by side/,/^UBLK OK/p' console.log || true
[ "$rc" = 0 ] || vm_fail "guest script exit $rc"
grep -q '^UBLK OK' console.log || vm_fail "the guest did not finish"
vm_log "pass"
