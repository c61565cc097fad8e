#!/usr/bin/env bash
# Snapshots of a LUN under the Linux kernel initiator's (open-iscsi) busy, mounted ext4 (issue 49):
# while fio writes with verify at QD32 and a loop creates, fsyncs, renames and removes files, the
# host takes three snapshots a second apart (`iscsi target snapshot`), then one more once the guest
# has unmounted. A reload serves them as LUNs (`snapshot:0/NAME`, read-only) and as clones
# (`clone:0/NAME`, writable). The guest rescans and finds: the snapshots write protected (the
# kernel marks the disks read-only, a write fails); each clone mounts (the kernel replays the
# journal, as after a power cut at the moment it was taken), and after that e2fsck finds its file
# system clean; the quiet snapshot fsck-clean as it is, holding the same fio file as the LUN.
# Guest side: guest/snapshot-ext4.sh.
set -euo pipefail
# shellcheck source=tests/linux-vm/lib.sh
source "$(dirname "$0")/../lib.sh"
vm_setup
port=$(vm_free_port)
iqn=iqn.2026-11.rs.iscsi.test:snapshot
file=$VM_WORK/target.toml
control=$VM_WORK/control.sock
config() {
    cat >"$file" <<TOML
listen = ["127.0.0.1:$port"]
[[target]]
name = "$iqn"
[target.lun]
0 = "ram:256M"
$1
TOML
}
config ""
target_start t0 "$port" --config "$file" --control "$control"
echo "PORT=$port IQN=$iqn" >params.sh
guest=$LINUX_VM_DIR/guest
vm_run_bg --to-host "$port" --timeout 600 "$guest/snapshot-ext4.sh" "$guest/open-iscsi-lib.sh" params.sh

ctl() { "$ISCSI_BIN" target "$@" --control "$control"; }

vm_wait_file "$VM_SHARE/out/fio-started" 300 "$VM_RUN_PID" || { wait "$VM_RUN_PID" || true; vm_fail "the guest did not start writing"; }
for n in 0 1 2; do
    sleep 1
    ctl snapshot "$iqn" 0 "busy$n" || vm_fail "snapshot busy$n was refused"
done
vm_log "three snapshots taken while the guest writes"
touch "$VM_SHARE/snapshots-taken"

vm_wait_file "$VM_SHARE/out/quiet" 300 "$VM_RUN_PID" || { wait "$VM_RUN_PID" || true; vm_fail "the guest did not unmount"; }
ctl snapshot "$iqn" 0 quiet || vm_fail "snapshot quiet was refused"
if ctl snapshot "$iqn" 0 quiet >twice.out 2>&1; then vm_fail "a second snapshot named quiet was taken"; fi
grep -q 'exists already' twice.out || vm_fail "the second quiet was refused for another reason: $(cat twice.out)"
ctl snapshot "$iqn" 0 | tee snapshots.out
[ "$(grep -cE '^(busy[0-2]|quiet) ' snapshots.out)" = 4 ] || vm_fail "the list does not show the four snapshots"

config "1 = \"snapshot:0/busy0\"
2 = \"snapshot:0/busy1\"
3 = \"snapshot:0/busy2\"
4 = \"clone:0/busy0\"
5 = \"clone:0/busy1\"
6 = \"clone:0/busy2\"
7 = \"snapshot:0/quiet\""
ctl reload | tee reload.out || vm_fail "serving the snapshots was refused"
# Into a file, then grep: `ctl ... | grep -q` under pipefail fails whenever grep has matched and
# left before ctl wrote its last line (ctl's write then fails: a run in CI failed so).
ctl snapshot "$iqn" 0 >served.out
grep -q 'busy1 .*served as LUN \[2\]' served.out || vm_fail "the list does not say which LUN serves busy1: $(cat served.out)"
if ctl snapshot "$iqn" 0 busy1 --delete >delete.out 2>&1; then vm_fail "a served snapshot was deleted"; fi
grep -q 'served as LUN 2' delete.out || vm_fail "the refused delete does not name the LUN: $(cat delete.out)"
touch "$VM_SHARE/snapshots-served"

rc=0
wait "$VM_RUN_PID" || rc=$?
grep -E '^(ok|not ok) - |^# ' console.log || true
target_alive t0 || vm_fail "the target died"
[ "$rc" = 0 ] || vm_fail "guest script exit $rc"
grep -q '^SNAPSHOT EXT4 OK' console.log || vm_fail "the guest did not finish"
vm_log "pass"
