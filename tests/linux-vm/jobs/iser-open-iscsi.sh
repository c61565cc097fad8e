#!/usr/bin/env bash
# The Linux kernel's iSER initiator (open-iscsi with ib_iser over soft iWARP, siw, in the VM) against
# `iscsi target --iser` on the host, through the forward 10.0.2.100:PORT: login on the `iser` iface,
# mkfs.ext4 + copy + fsck, fio randwrite+verify at QD32 with 4k and 1m blocks, logout, a new login
# finds the data again. siw.ko is built on the host for the image's kernel (build-siw, cached).
# Guest side: guest/iser-open-iscsi.sh (+ guest/siw-up.sh, guest/open-iscsi-lib.sh).
set -euo pipefail
# shellcheck source=tests/linux-vm/lib.sh
source "$(dirname "$0")/../lib.sh"
vm_setup
# The module first (it needs the image's kernel version, so build-siw builds the image if needed).
siw=$("$LINUX_VM_DIR/build-siw") || vm_fail "build-siw could not build siw.ko for the VM's kernel"
# iSER is part of every build: a binary without it fails here, clearly, rather than as a target
# that "exited at start".
vm_iscsi_has_iser_target || vm_fail "$ISCSI_BIN has no \`iscsi target --iser\`"
port=$(vm_free_port)   # the iSER portal, the guest's 10.0.2.100:$port
tcp=$(vm_free_port)    # the target's TCP portal (unused here; iSER and TCP cannot share a port)
iqn=iqn.2026-11.rs.iscsi.test:iser
cat >params.sh <<PARAMS
PORT=$port
IQN=$iqn
PARAMS
target_start t0 "$port" --listen "127.0.0.1:$tcp" --iser "127.0.0.1:$port" --name "$iqn" --lun ram:256M
guest=$LINUX_VM_DIR/guest
rc=0
vm_run --to-host "$port" --timeout 900 "$guest/iser-open-iscsi.sh" "$guest/open-iscsi-lib.sh" \
    "$guest/siw-up.sh" "$siw" params.sh || rc=$?
grep -E '^(ok|not ok) - ' console.log || true
target_alive t0 || vm_fail "the target died"
[ "$rc" = 0 ] || vm_fail "guest script exit $rc"
grep -q '^ISER OPEN-ISCSI OK' console.log || vm_fail "the guest did not finish"
vm_log "pass"
