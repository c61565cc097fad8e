#!/usr/bin/env bash
# EXTENDED COPY through the Linux kernel initiator (open-iscsi) and sg3-utils' sg_xcopy against
# `iscsi target` with two RAM LUNs: a known pattern copied from LUN 0 to LUN 1 and within LUN 1,
# verified byte for byte, and a copy past the end refused. Guest side: guest/xcopy-sg3.sh.
set -euo pipefail
# shellcheck source=tests/linux-vm/lib.sh
source "$(dirname "$0")/../lib.sh"
vm_setup
port=$(vm_free_port)
iqn=iqn.2026-11.rs.iscsi.test:xcopy
target_start t0 "$port" --name "$iqn" --lun ram:64M --lun ram:64M
echo "PORT=$port IQN=$iqn SIZE_BYTES=$((64 << 20))" >params.sh
guest=$LINUX_VM_DIR/guest
rc=0
vm_run --to-host "$port" --timeout 600 "$guest/xcopy-sg3.sh" "$guest/open-iscsi-lib.sh" params.sh || rc=$?
grep -E '^(ok|not ok) - ' console.log || true
target_alive t0 || vm_fail "the target died"
[ "$rc" = 0 ] || vm_fail "guest script exit $rc"
grep -q '^XCOPY OK' console.log || vm_fail "the guest did not finish"
vm_log "pass"
