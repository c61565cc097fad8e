#!/usr/bin/env bash
# `iscsi target --config FILE` changed while the Linux kernel initiator (open-iscsi) runs fio with
# verify on LUN 0 (a file LUN): a file with a mistake is refused by SIGHUP and by `iscsi target
# reload` and leaves the target exactly as it was; then one file adds LUN 2, changes the ACL
# (keeping the guest) and removes LUN 1, which the guest's scan used: refused without force, naming
# the session, applied with --force. The guest rescans: LUN 2 appears and takes writes, LUN 1
# fails cleanly and its disk is deleted, and fio sees no error (a verify-only pass after). Guest
# side: guest/live-config.sh.
set -euo pipefail
# shellcheck source=tests/linux-vm/lib.sh
source "$(dirname "$0")/../lib.sh"
vm_setup
port=$(vm_free_port)
iqn=iqn.2026-11.rs.iscsi.test:live
guest_iqn=iqn.2026-11.rs.iscsi.test:live-guest
file=$VM_WORK/target.toml
control=$VM_WORK/control.sock
# config LUNS ACL: the target's file.
config() {
    cat >"$file" <<TOML
listen = ["127.0.0.1:$port"]
[[target]]
name = "$iqn"
allowed_initiators = [$2]
[target.lun]
$1
TOML
}
lun0="0 = \"file:$VM_WORK/live.img,size=256M\""
config "$lun0
1 = \"ram:64M\"" "\"$guest_iqn\", \"iqn.2026-11.rs.iscsi.test:someone\""
target_start t0 "$port" --config "$file" --control "$control"
echo "PORT=$port IQN=$iqn GUEST_IQN=$guest_iqn" >params.sh
guest=$LINUX_VM_DIR/guest
vm_run_bg --to-host "$port" --timeout 600 "$guest/live-config.sh" "$guest/open-iscsi-lib.sh" params.sh

ctl() { "$ISCSI_BIN" target "$@" --control "$control"; }
# What a reload must not touch when it fails: LUNs, stores, ACL.
shape() { ctl status --json | jq -c '[.targets[] | {name, allowed_initiators, luns: [.luns[] | {lun, backstore}]}]'; }

vm_wait_file "$VM_SHARE/out/fio-started" 240 "$VM_RUN_PID" || { wait "$VM_RUN_PID" || true; vm_fail "the guest did not start writing"; }
before=$(shape)
vm_log "running: $before"
ctl status

# A file with a mistake (a backstore that does not exist), by signal and by command: nothing moves.
config "$lun0
1 = \"ram:64M\"
2 = \"tape:1G\"" "\"$guest_iqn\""
kill -HUP "$(target_pid t0)"
if ctl reload >reload.out 2>&1; then cat reload.out; vm_fail "a file with a mistake was applied"; fi
cat reload.out
grep -q 'unknown backstore "tape"' reload.out || vm_fail "the refusal does not name the mistake"
[ "$(shape)" = "$before" ] || vm_fail "a refused file changed the target: $(shape)"
vm_log "the file with a mistake was refused; nothing changed"

# LUN 2 added, the ACL changed, LUN 1 removed: LUN 1 was scanned by the guest, so without force the
# reload is refused and names the session.
config "$lun0
2 = \"ram:32M\"" "\"$guest_iqn\""
if ctl reload >reload.out 2>&1; then cat reload.out; vm_fail "removing a LUN in use was applied without force"; fi
cat reload.out
grep -q "LUN 1" reload.out && grep -q "$guest_iqn" reload.out || vm_fail "the refusal does not name the LUN and the session"
[ "$(shape)" = "$before" ] || vm_fail "a refused reload changed the target"
ctl reload --force || vm_fail "the forced reload failed"
after=$(shape)
vm_log "applied: $after"
[ "$(jq -c '[.[0].luns[].lun]' <<<"$after")" = "[0,2]" ] || vm_fail "LUNs after the reload: $after"
[ "$(jq -c '.[0].allowed_initiators' <<<"$after")" = "[\"$guest_iqn\"]" ] || vm_fail "ACL after the reload: $after"
touch "$VM_SHARE/reload-done"

rc=0
wait "$VM_RUN_PID" || rc=$?
grep -E '^(ok|not ok) - ' console.log || true
target_alive t0 || vm_fail "the target died"
[ "$rc" = 0 ] || vm_fail "guest script exit $rc"
grep -q '^LIVE CONFIG OK' console.log || vm_fail "the guest did not finish"
grep -q "configuration reloaded" "$(target_log t0)" || vm_fail "the target did not log the reload"
vm_log "pass"
