#!/usr/bin/env bash
# sg3-utils through the Linux kernel initiator (open-iscsi) against `iscsi target`'s thin RAM LUN:
# INQUIRY/VPD, READ CAPACITY(16), persistent reservations, UNMAP, WRITE SAME, COMPARE AND WRITE,
# SYNCHRONIZE CACHE, LUN and target reset, each checked for data or sense. Guest side:
# guest/open-iscsi-sg3.sh.
set -euo pipefail
# shellcheck source=tests/linux-vm/lib.sh
source "$(dirname "$0")/../lib.sh"
vm_setup
port=$(vm_free_port)
iqn=iqn.2026-11.rs.iscsi.test:sg3
target_start t0 "$port" --name "$iqn" --lun ram:64M
echo "PORT=$port IQN=$iqn SIZE_BYTES=$((64 << 20))" >params.sh
guest=$LINUX_VM_DIR/guest
rc=0
vm_run --to-host "$port" --timeout 600 "$guest/open-iscsi-sg3.sh" "$guest/open-iscsi-lib.sh" params.sh || rc=$?
grep -E '^(ok|not ok) - ' console.log || true
target_alive t0 || vm_fail "the target died"
[ "$rc" = 0 ] || vm_fail "guest script exit $rc"
grep -q '^SG3 OK' console.log || vm_fail "the guest did not finish"
vm_log "pass"
