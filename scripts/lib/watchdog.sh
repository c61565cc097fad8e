# shellcheck shell=bash
# watched SECONDS CMD...: runs CMD, and if it is still running after SECONDS, says so on stderr with
# the stack of every thread of every process under it, kills them all, and returns 124. A hung test
# then fails the run in minutes, saying where it hangs, instead of using up CI's whole time and
# printing nothing but "has been running for over 60 seconds" (stop 44: librbd held a write for
# good, and CI ran out of time 50 minutes later with no stack to tell where).
#
#   source scripts/lib/watchdog.sh
#   watched 1200 cargo test ... -p iscsi-ceph --features ceph-tests --lib
#
# The stacks come from gdb when it is installed (every frame, librbd's included), else from /proc
# (each thread's name and the kernel function it waits in). SECONDS must be far above the command's
# slowest honest run on a loaded 2-core machine: a limit it can reach by chance fails CI by chance.

# watch_tree PID: PID and every process under it, parents first.
watch_tree() {
    local child
    echo "$1"
    for child in $(pgrep -P "$1" 2>/dev/null); do
        watch_tree "$child"
    done
}

# watch_stacks PID: the stacks of every thread of PID, on stdout.
watch_stacks() {
    local pid=$1 task
    echo "--- process $pid: $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-200)"
    if command -v gdb >/dev/null 2>&1; then
        timeout 60 gdb -p "$pid" -batch -nx -ex "set pagination off" -ex "thread apply all bt" 2>&1 |
            grep -E '^(Thread|#)' | cut -c1-300
    else
        for task in /proc/"$pid"/task/*; do
            echo "thread $(cat "$task/comm" 2>/dev/null) waits in $(cat "$task/wchan" 2>/dev/null)"
        done
    fi
}

watched() {
    local limit=$1 pid waited=0 status=0 p
    shift
    "$@" &
    pid=$!
    # A job started with & ignores Ctrl-C in a script: pass it on.
    trap 'kill -TERM "$pid" 2>/dev/null' INT TERM
    while kill -0 "$pid" 2>/dev/null; do
        if ((waited >= limit)); then
            local tree
            tree=$(watch_tree "$pid")
            {
                echo "watched: still running after ${limit} s, killed: $*"
                for p in $tree; do
                    watch_stacks "$p"
                done
            } >&2
            # shellcheck disable=SC2086 # a list of PIDs
            kill -KILL $tree 2>/dev/null
            wait "$pid" 2>/dev/null
            trap - INT TERM
            return 124
        fi
        sleep 1
        waited=$((waited + 1))
    done
    wait "$pid" || status=$?
    trap - INT TERM
    return "$status"
}
