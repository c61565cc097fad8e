#!/usr/bin/env bash
# `iscsi target` restarted under the Linux kernel initiator: while open-iscsi writes at QD32 to a
# file LUN, the target is stopped (SIGINT: its graceful shutdown, which asks the initiator to log
# out; then SIGKILL) and started again on the same port with the same file. The initiator must recover its session by itself and lose no acknowledged
# write. Then, in the same boot, the connection is cut twice through `iscsi fault-proxy` (in the
# guest, between the kernel initiator and the target) under fio verify: recovered with no error
# seen by fio. Guest side: guest/open-iscsi-restart.sh.
set -euo pipefail
# shellcheck source=tests/linux-vm/lib.sh
source "$(dirname "$0")/../lib.sh"
vm_setup
port=$(vm_free_port)
iqn=iqn.2026-11.rs.iscsi.test:restart
args=(--name "$iqn" --lun "file:$VM_WORK/restart.img,size=256M")
target_start t0 "$port" "${args[@]}"
echo "PORT=$port IQN=$iqn" >params.sh
cp "$ISCSI_BIN" ./iscsi
guest=$LINUX_VM_DIR/guest
# --to-host-retry: open-iscsi 2.1.8 reconnecting to the stopped target must not see accept-then-close,
# after which it never logs in again (tests/linux-vm/README.md, `run`).
vm_run_bg --to-host-retry "$port" --timeout 600 "$guest/open-iscsi-restart.sh" "$guest/open-iscsi-lib.sh" params.sh ./iscsi

# How many logins to $iqn the target's log shows (colour codes stripped).
logins() { sed 's/\x1b\[[0-9;]*m//g' "$(target_log t0)" | grep -c "login complete.*target=\"$iqn\"" || true; }

# restart SIGNAL: stops the target with SIGNAL, starts it again 1 s later, and waits (up to 60 s)
# until the initiator has logged in again by itself.
restart() {
    local sig=$1 before i
    sleep 2
    vm_log "SIG$sig to the target (PID $(target_pid t0)) while the guest writes"
    target_stop t0 "$sig"
    before=$(logins)
    sleep 1
    target_restart t0
    for i in $(seq 1 600); do
        [ "$(logins)" -gt "$before" ] && { vm_log "the initiator logged in again after $((i / 10)) s"; return 0; }
        kill -0 "$VM_RUN_PID" 2>/dev/null || vm_fail "the VM ended before the initiator came back"
        sleep 0.1
    done
    vm_fail "the initiator did not log in again within 60 s"
}

vm_wait_file "$VM_SHARE/out/fio-started" 240 "$VM_RUN_PID" || { wait "$VM_RUN_PID" || true; vm_fail "the guest did not start writing"; }
restart INT
restart KILL
touch "$VM_SHARE/restarts-done"
rc=0
wait "$VM_RUN_PID" || rc=$?
rm -f ./iscsi
grep -E '^(ok|not ok) - ' console.log || true
target_alive t0 || vm_fail "the target died"
[ "$rc" = 0 ] || vm_fail "guest script exit $rc"
grep -q '^RESTART OK' console.log || vm_fail "the guest did not finish"
vm_log "pass"
