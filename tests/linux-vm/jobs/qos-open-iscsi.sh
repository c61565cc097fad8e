#!/usr/bin/env bash
# QoS limits under the Linux kernel initiator (issue 49). LUN 0 is limited to 200 IOPS with a
# queue of 8 (shorter than open-iscsi's queue depth of 32, so TASK SET FULL is answered); LUN 1 is
# free. The guest runs fio 4 KiB random reads at QD 64 on LUN 0 beside fio at QD 16 on LUN 1: LUN
# 0's rate holds to the limit, LUN 1 runs faster, no I/O error; then fio random writes with verify
# on LUN 0 through the TASK SET FULLs, and a verify-only pass finds every acknowledged write. The
# host checks that the target answered TASK SET FULL and held commands. Guest side:
# guest/qos-open-iscsi.sh.
set -euo pipefail
# shellcheck source=tests/linux-vm/lib.sh
source "$(dirname "$0")/../lib.sh"
vm_setup
port=$(vm_free_port)
iqn=iqn.2026-11.rs.iscsi.test:qos
file=$VM_WORK/target.toml
control=$VM_WORK/control.sock
cat >"$file" <<TOML
listen = ["127.0.0.1:$port"]
[[target]]
name = "$iqn"
luns = ["ram:256M", "ram:256M"]
[[target.limit]]
lun = 0
iops = 200
queue = 8
TOML
target_start t0 "$port" --config "$file" --control "$control"
echo "PORT=$port IQN=$iqn" >params.sh
guest=$LINUX_VM_DIR/guest
vm_run_bg --to-host "$port" --timeout 600 "$guest/qos-open-iscsi.sh" "$guest/open-iscsi-lib.sh" params.sh

rc=0
wait "$VM_RUN_PID" || rc=$?
grep -E '^(ok|not ok) - ' console.log || true
target_alive t0 || vm_fail "the target died"
[ "$rc" = 0 ] || vm_fail "guest script exit $rc"
grep -q '^QOS OK' console.log || vm_fail "the guest did not finish"
status=$("$ISCSI_BIN" target status --json --control "$control")
limit=$(jq -c '.targets[0].limits[0]' <<<"$status")
vm_log "the limit after the runs: $limit"
[ "$(jq '.now.refused' <<<"$limit")" -gt 0 ] || vm_fail "no TASK SET FULL was answered with a queue of 8"
[ "$(jq '.now.delayed' <<<"$limit")" -gt 0 ] || vm_fail "no command was held"
vm_log "pass"
