# Host-side helpers for the jobs in tests/linux-vm/jobs/ (source it; bash only):
#
#   source "$(dirname "$0")/../lib.sh"
#   vm_setup                          # work dir $VM_WORK (cwd), cleanup + diagnostics on exit
#   port=$(vm_free_port)              # a free TCP port on 127.0.0.1
#   target_start t0 "$port" --lun ram:64M     # `iscsi target --listen 127.0.0.1:PORT ARGS...`
#   target_start t1 "$port" --config f.toml   # with --config the file's `listen` is used instead
#   target_start t2 "$port" --listen 127.0.0.1:"$tcp" --iser 127.0.0.1:"$port" --lun ram:64M
#                                     # an iSER portal on PORT (waited for), TCP on another port
#   vm_run --to-host "$port" guest.sh files...  # tests/linux-vm/run; console in $VM_WORK/console.log
#   target_stop t0 / target_kill t0 / target_pid t0 / target_log t0
#   vm_run_bg ... / vm_wait_file PATH S "$VM_RUN_PID" / vm_power_cut   # a VM in the background
#
# Environment: ISCSI_BIN (default <repo>/target/ci/iscsi), LINUX_VM_IMAGE (see run),
# TARGET_RUST_LOG (RUST_LOG of the targets, default info), LINUX_VM_VERBOSE=1 (console to stdout
# as well), LINUX_VM_KEEP=1 (keep $VM_WORK; it is always kept when the job fails),
# LINUX_VM_TAIL (lines of console/log shown on failure, default 80), LINUX_VM_CAPTURE=1 (tshark
# records each target port's traffic in $VM_WORK/capture-PORT.pcapng).
# On a non-zero exit the tail of the guest console and of every target's log is printed, and every
# target still running is stopped. vm_skip REASON exits 77 ("skip" in scripts/linux-vm-tests).

LINUX_VM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LINUX_VM_REPO=$(cd "$LINUX_VM_DIR/../.." && pwd)
ISCSI_BIN=${ISCSI_BIN:-$LINUX_VM_REPO/target/ci/iscsi}
# Every job runs under `set -euo pipefail`: one that stops on an error says where (file, line,
# command, status) before the exit trap's diagnostics.
# shellcheck source=scripts/lib/on-error.sh
source "$LINUX_VM_REPO/scripts/lib/on-error.sh"
# shellcheck source=scripts/lib/ports.sh
source "$LINUX_VM_REPO/scripts/lib/ports.sh"
declare -A VM_TARGET_PID=() VM_TARGET_ARGS=() VM_TARGET_PORT=() VM_CAPTURE_PID=()

vm_log() { echo "[$(date +%T)] ${VM_JOB:-job}: $*"; }
vm_fail() { echo "[$(date +%T)] ${VM_JOB:-job}: FAIL: $*" >&2; exit 1; }
# vm_skip REASON: the job cannot run with this binary (e.g. a feature not built in yet): exit 77,
# which scripts/linux-vm-tests reports as "skip", not as a failure.
VM_SKIP_STATUS=77
vm_skip() { echo "[$(date +%T)] ${VM_JOB:-job}: SKIP: $*"; exit "$VM_SKIP_STATUS"; }

# The URL the iSER probes open: port 1 on loopback refuses at once (no traffic leaves the machine).
VM_ISER_PROBE_URL=iser://127.0.0.1:1/iqn.2026-11.rs.iscsi:probe/0

# vm_iscsi_has_iser_urls: $ISCSI_BIN's initiator subcommands take iser:// URLs. The probe asks it to
# open one on a port that refuses: a binary without iSER rejects the URL itself ("invalid iSCSI URL
# ... must start with iscsi://"); any other failure (connection refused...) means it tried.
vm_iscsi_has_iser_urls() {
    local said
    said=$(timeout 20 "$ISCSI_BIN" inquiry "$VM_ISER_PROBE_URL" 2>&1 </dev/null) || true
    case $said in
        *'invalid iSCSI URL'* | *'must start with iscsi://'*) return 1 ;;
        *) return 0 ;;
    esac
}

# vm_iscsi_has_iser_target: `$ISCSI_BIN target` has the --iser option.
vm_iscsi_has_iser_target() {
    local said
    said=$("$ISCSI_BIN" target --help 2>&1 </dev/null) || true
    [[ $said == *--iser* ]]
}

# Creates the job's work directory and makes it the current directory (./vm-out lands there).
vm_setup() {
    VM_JOB=${VM_JOB:-$(basename "$0" .sh)}
    [ -x "$ISCSI_BIN" ] || vm_fail "no iscsi binary at $ISCSI_BIN (set ISCSI_BIN)"
    VM_WORK=$(mktemp -d "/tmp/linux-vm-$VM_JOB.XXXXXX")
    : >"$VM_WORK/console.log"
    cd "$VM_WORK" || exit 1
    trap '_vm_exit $?' EXIT
}

_vm_exit() {
    local rc=$1 name n=${LINUX_VM_TAIL:-80}
    trap - EXIT
    # A VM still running in the background (vm_run_bg): stop run's children (timeout passes the
    # signal on to qemu), then run itself.
    if [ -n "${VM_RUN_PID:-}" ] && kill -0 "$VM_RUN_PID" 2>/dev/null; then
        pkill -TERM -P "$VM_RUN_PID" 2>/dev/null || true
        kill "$VM_RUN_PID" 2>/dev/null || true
        wait "$VM_RUN_PID" 2>/dev/null || true
    fi
    for name in "${!VM_TARGET_PID[@]}"; do target_stop "$name" 2>/dev/null || true; done
    for name in "${!VM_CAPTURE_PID[@]}"; do
        kill "${VM_CAPTURE_PID[$name]}" 2>/dev/null || true
        wait "${VM_CAPTURE_PID[$name]}" 2>/dev/null || true
    done
    if [ "$rc" -ne 0 ] && [ "$rc" -ne "$VM_SKIP_STATUS" ]; then
        # A guest kernel that crashed is named first: its trace is the likely cause, and it
        # scrolls out of the console's tail when the guest ran on after it.
        grep -m 3 -E 'Oops: |Kernel panic|BUG: |kernel BUG at' "$VM_WORK/console.log" 2>/dev/null |
            sed "s/^/$VM_JOB: FAIL: the guest kernel crashed: /" || true
        echo "===== $VM_JOB failed (exit $rc): last $n lines of the guest console ====="
        tail -n "$n" "$VM_WORK/console.log" 2>/dev/null || true
        for f in "$VM_WORK"/target-*.log; do
            [ -f "$f" ] || continue
            echo "===== last $n lines of ${f##*/} ====="
            tail -n "$n" "$f"
        done
        echo "===== the work directory is kept: $VM_WORK ====="
    elif [ "${LINUX_VM_KEEP:-0}" = 1 ]; then
        echo "$VM_JOB: work directory kept: $VM_WORK"
    else
        cd /
        rm -rf "$VM_WORK"
    fi
    exit "$rc"
}

# A TCP port on 127.0.0.1 that nothing uses (free_port of scripts/lib/ports.sh: random, below the
# kernel's ephemeral range, within the lane's TEST_PORT_RANGE when scripts/linux-vm-tests runs
# jobs side by side).
vm_free_port() {
    free_port || vm_fail "no free port found"
}

# Waits until 127.0.0.1:PORT accepts a connection, or the target NAME died, or 15 s passed.
_vm_wait_listening() {
    local name=$1 port=$2 _
    for _ in $(seq 1 150); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
        kill -0 "${VM_TARGET_PID[$name]}" 2>/dev/null || {
            tail -n 30 "$VM_WORK/target-$name.log" >&2
            vm_fail "target $name exited at start"
        }
        sleep 0.1
    done
    vm_fail "target $name does not listen on 127.0.0.1:$port"
}

# target_start NAME PORT [ARGS...]: starts `$ISCSI_BIN target` in the background (log appended to
# $VM_WORK/target-NAME.log) and waits until it listens on PORT. Adds --listen 127.0.0.1:PORT unless
# ARGS contain --config (the configuration file then names the portal; it must be 127.0.0.1:PORT)
# or --listen (e.g. an iSER portal `--iser 127.0.0.1:PORT`: iWARP listens in the TCP port space, so
# the TCP portal must be on another port; PORT is still the one waited for and captured).
target_start() {
    local name=$1 port=$2
    shift 2
    local -a args=("$@")
    # What target_restart repeats: the arguments as given.
    VM_TARGET_ARGS[$name]=$(printf '%q ' "$@")
    VM_TARGET_PORT[$name]=$port
    case " ${args[*]} " in
        *" --config "* | *" --listen "*) ;;
        *) args=(--listen "127.0.0.1:$port" "${args[@]}") ;;
    esac
    if [ "${LINUX_VM_CAPTURE:-0}" = 1 ] && [ -z "${VM_CAPTURE_PID[$port]:-}" ]; then
        # Debugging aid: every byte to and from the portal, for tshark -d tcp.port==PORT,iscsi.
        tshark -q -i lo -f "tcp port $port" -w "$VM_WORK/capture-$port.pcapng" >/dev/null 2>&1 &
        VM_CAPTURE_PID[$port]=$!
        sleep 2
    fi
    echo "=== $(date +%T) starting: iscsi target ${args[*]}" >>"$VM_WORK/target-$name.log"
    NO_COLOR=1 RUST_LOG=${TARGET_RUST_LOG:-info} "$ISCSI_BIN" target "${args[@]}" \
        >>"$VM_WORK/target-$name.log" 2>&1 </dev/null &
    VM_TARGET_PID[$name]=$!
    # Out of bash's job table: no "Killed" message when target_kill ends it.
    disown "${VM_TARGET_PID[$name]}"
    _vm_wait_listening "$name" "$port"
}

# target_restart NAME: starts NAME again with the arguments and port it had (after a stop/kill).
target_restart() {
    local name=$1
    eval "local -a args=(${VM_TARGET_ARGS[$name]})"
    # shellcheck disable=SC2154 # args is set by the eval above
    target_start "$name" "${VM_TARGET_PORT[$name]}" "${args[@]}"
}

# target_stop NAME [SIGNAL]: sends SIGNAL (default TERM) to the target's PID and waits for it to
# exit (KILL after 10 s).
target_stop() {
    local name=$1 sig=${2:-TERM} pid _
    pid=${VM_TARGET_PID[$name]:-}
    [ -n "$pid" ] || return 0
    kill "-$sig" "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    echo "=== $(date +%T) stopped with SIG$sig" >>"$VM_WORK/target-$name.log"
    unset "VM_TARGET_PID[$name]"
}

# target_kill NAME: kills the target at once (SIGKILL): no logout, no goodbye.
target_kill() { target_stop "$1" KILL; }

# vm_kill_then_restart NAME [ROUND]: the failover handshake of the gateway jobs. SIGKILLs target
# NAME under the guest's fio and tells it (./target-killed); once the guest asks
# (out/restart-target), starts NAME again on its port and tells it (./target-restarted). A guest
# that ends first fails the job. With ROUND (jobs that kill several times), each file's name ends
# in .ROUND.
vm_kill_then_restart() {
    local round=${2:+.$2}
    vm_log "SIGKILL to the owner $1 (PID $(target_pid "$1")) under fio${2:+ (round $2)}"
    target_kill "$1"
    touch "$VM_SHARE/target-killed$round"
    vm_wait_file "$VM_SHARE/out/restart-target$round" 600 "$VM_RUN_PID" || { wait "$VM_RUN_PID" || true; vm_fail "the guest did not finish the failover"; }
    vm_log "starting $1 again"
    target_restart "$1"
    touch "$VM_SHARE/target-restarted$round"
}

target_pid() { echo "${VM_TARGET_PID[$1]:-}"; }
# process_stop PID: SIGSTOP, returning once every thread of PID has stopped. kill only queues the
# signal; on a loaded host the threads not chosen to take it run on until the group stop reaches
# them, long enough to answer one more command (iscsi_test_peers::stop_process says the same).
process_stop() {
    local task state i
    kill -STOP "$1"
    for ((i = 0; i < 3000; i++)); do
        state=T
        for task in /proc/"$1"/task/*; do
            # The state is the field after the name, which ends at the last ')'.
            [[ $(cat "$task/stat" 2>/dev/null) =~ ^.*\)\ ([A-Za-z]) ]] || continue
            case ${BASH_REMATCH[1]} in T | t | Z | X) ;; *) state=running ;; esac
        done
        [ "$state" = T ] && return 0
        sleep 0.01
    done
    vm_fail "process $1 did not stop in 30 s after SIGSTOP"
}
target_log() { echo "$VM_WORK/target-$1.log"; }
# target_alive NAME: true while the target process runs.
target_alive() { [ -n "${VM_TARGET_PID[$1]:-}" ] && kill -0 "${VM_TARGET_PID[$1]}" 2>/dev/null; }

# vm_run [run's arguments]: boots the VM (tests/linux-vm/run) with the console appended to
# $VM_WORK/console.log (and shown when LINUX_VM_VERBOSE=1). Returns the guest script's status.
vm_run() {
    local rc=0
    echo "=== $(date +%T) run $*" >>"$VM_WORK/console.log"
    if [ "${LINUX_VM_VERBOSE:-0}" = 1 ]; then
        "$LINUX_VM_DIR/run" "$@" 2>&1 | tee -a "$VM_WORK/console.log" || rc=$?
        # tee's status hides run's: take run's from PIPESTATUS.
        rc=${PIPESTATUS[0]}
    else
        "$LINUX_VM_DIR/run" "$@" >>"$VM_WORK/console.log" 2>&1 || rc=$?
    fi
    return "$rc"
}

# vm_run_bg [run's arguments]: like vm_run but in the background, with the guest's working
# directory shared as $VM_SHARE (the guest's /mnt/host) so the host can watch files the guest writes
# there and write files the guest waits for. VM_RUN_PID is the PID to `wait` on.
vm_run_bg() {
    VM_SHARE=$VM_WORK/share
    rm -rf "$VM_SHARE"
    mkdir -p "$VM_SHARE"
    echo "=== $(date +%T) run (background) $*" >>"$VM_WORK/console.log"
    LINUX_VM_SHARE=$VM_SHARE "$LINUX_VM_DIR/run" "$@" >>"$VM_WORK/console.log" 2>&1 &
    VM_RUN_PID=$!
}

# vm_power_cut: kills (SIGKILL) the qemu of the VM started by vm_run_bg, not the `timeout` that
# started it (its command line holds the same words): for the guest, a power cut. Prints qemu's PID.
# Reads /proc rather than using pgrep, which the host may not have (procps).
vm_power_cut() {
    local f pid cmd
    for f in /proc/[0-9]*/cmdline; do
        cmd=$(tr '\0' ' ' <"$f" 2>/dev/null) || continue
        [[ $cmd == "qemu-system-x86_64 "*"$VM_SHARE"* ]] || continue
        pid=${f#/proc/}
        pid=${pid%/cmdline}
        kill -KILL "$pid" 2>/dev/null || continue
        echo "$pid"
        return 0
    done
    return 1
}

# vm_wait_file PATH TIMEOUT_S [PID]: waits until PATH exists (e.g. a mark the guest writes to the
# shared directory); fails after TIMEOUT_S seconds or when PID (the VM) has exited.
vm_wait_file() {
    local path=$1 t=$2 pid=${3:-} _
    for _ in $(seq 1 $((t * 5))); do
        [ -e "$path" ] && return 0
        if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then return 1; fi
        sleep 0.2
    done
    return 1
}
