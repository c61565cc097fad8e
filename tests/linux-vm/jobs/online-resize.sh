#!/usr/bin/env bash
# A LUN grown while the Linux kernel initiator (open-iscsi) has an ext4 on it mounted and fio
# writing with verify (issue 49): the host edits the target's file (a file LUN of 256 MiB made 512
# MiB) and reloads, with no --force and no session disturbed; the guest rescans, the disk shows the
# new size, resize2fs grows the mounted file system online, and a second fio pass writes a file the
# old space cannot hold. After a remount both files verify, and fsck finds the file system clean.
# Then a shrink below the file system's end is refused (no --force), naming the session, and a
# forced one is refused over the data beyond it: the disk keeps its size. Guest side:
# guest/online-resize.sh.
set -euo pipefail
# shellcheck source=tests/linux-vm/lib.sh
source "$(dirname "$0")/../lib.sh"
vm_setup
port=$(vm_free_port)
iqn=iqn.2026-11.rs.iscsi.test:resize
file=$VM_WORK/target.toml
control=$VM_WORK/control.sock
image=$VM_WORK/resize.img
config() {
    cat >"$file" <<TOML
listen = ["127.0.0.1:$port"]
[[target]]
name = "$iqn"
[target.lun]
0 = "file:$image,size=$1"
TOML
}
config 256M
target_start t0 "$port" --config "$file" --control "$control"
echo "PORT=$port IQN=$iqn" >params.sh
guest=$LINUX_VM_DIR/guest
vm_run_bg --to-host "$port" --timeout 600 "$guest/online-resize.sh" "$guest/open-iscsi-lib.sh" params.sh

ctl() { "$ISCSI_BIN" target "$@" --control "$control"; }
size_now() { ctl status --json | jq '.targets[0].luns[0].size_bytes'; }

vm_wait_file "$VM_SHARE/out/fio-started" 300 "$VM_RUN_PID" || { wait "$VM_RUN_PID" || true; vm_fail "the guest did not start writing"; }
config 512M
ctl check "$file" | tee check.out
grep -q 'grows from 268435456 to 536870912 bytes in place' check.out || vm_fail "check does not show the growth"
ctl reload | tee reload.out || vm_fail "the growth was refused"
[ "$(size_now)" = 536870912 ] || vm_fail "the LUN is $(size_now) bytes after the reload"
[ "$(stat -c %s "$image")" = 536870912 ] || vm_fail "the file was not extended"
vm_log "grown to 512 MiB while fio writes"
touch "$VM_SHARE/resize-done"

vm_wait_file "$VM_SHARE/out/grown-fs" 400 "$VM_RUN_PID" || { wait "$VM_RUN_PID" || true; vm_fail "the guest did not grow its file system"; }
# A shrink to 256M: the file system now reaches past it. Without force: refused, naming the
# session; forced: refused over the data (nothing discards it by reload).
config 256M
if ctl reload >shrink.out 2>&1; then cat shrink.out; vm_fail "a shrink was applied without force"; fi
cat shrink.out
grep -q 'shrinks a LUN in use by' shrink.out || vm_fail "the refusal does not name the session"
if ctl reload --force >shrink.out 2>&1; then cat shrink.out; vm_fail "a shrink over the file system's data was applied"; fi
cat shrink.out
grep -q 'beyond the new end' shrink.out || vm_fail "the forced shrink was refused for another reason"
[ "$(size_now)" = 536870912 ] || vm_fail "a refused shrink changed the size: $(size_now)"
config 512M
touch "$VM_SHARE/shrink-refused"

rc=0
wait "$VM_RUN_PID" || rc=$?
grep -E '^(ok|not ok) - ' console.log || true
target_alive t0 || vm_fail "the target died"
[ "$rc" = 0 ] || vm_fail "guest script exit $rc"
grep -q '^ONLINE RESIZE OK' console.log || vm_fail "the guest did not finish"
grep -q "configuration reloaded" "$(target_log t0)" || vm_fail "the target did not log the reload"
vm_log "pass"
