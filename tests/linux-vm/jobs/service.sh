#!/usr/bin/env bash
# The target as a systemd service (issue 34, item 5): the .deb of scripts/build-deb (packaging/)
# installed in a VM booted with systemd as PID 1 (run --systemd: systemd 254 from bookworm-backports,
# which has Type=notify-reload); the iscsi-target unit started from the example configuration as
# installed, open-iscsi in the same VM logged in through discovery, I/O, `iscsi target status`;
# a target added to the file and `systemctl reload`: applied, the session and its data kept; `systemctl stop` with the session logged in, ending with
# Result=success (no SIGKILL); then the same unit, hardening and all, serving a file LUN under /srv
# and a block LUN (the VM's /dev/vdb). Guest side: guest/service.sh. One boot, ~1-2 minutes.
# ISCSI_DEB=FILE: install that package instead of building one from $ISCSI_BIN.
# The unit's journal, systemctl status and the boot's warnings come back in vm-out/ (the work
# directory is kept on failure).
set -euo pipefail
# shellcheck source=tests/linux-vm/lib.sh
source "$(dirname "$0")/../lib.sh"
vm_setup
if [ -n "${ISCSI_DEB:-}" ]; then
    cp "$ISCSI_DEB" ./iscsi-rs.deb
else
    # The binary the other jobs test, packaged as scripts/build-deb packages the release one.
    deb=$("$LINUX_VM_REPO/scripts/build-deb" --binary "$ISCSI_BIN" --out "$VM_WORK/deb")
    cp "$deb" ./iscsi-rs.deb
fi
vm_log "package: $(dpkg-deb -f iscsi-rs.deb Package Version Architecture Depends | tr '\n' ' ')"
truncate -s 64M block.img
guest=$LINUX_VM_DIR/guest
rc=0
vm_run --systemd --disk block.img --timeout 600 "$guest/service.sh" "$guest/open-iscsi-lib.sh" \
    iscsi-rs.deb || rc=$?
grep -E '^(ok|not ok) - |^# ' console.log || true
[ "$rc" = 0 ] || vm_fail "guest script exit $rc (the unit's journal: $VM_WORK/vm-out/journal.txt)"
grep -q '^SERVICE OK' console.log || vm_fail "the guest did not finish"
vm_log "pass"
