# Runs jobs side by side in lanes (source it; bash). scripts/linux-vm-tests runs its VM jobs so.
#
#   lanes_run DIR LANES JOB...
#
# Runs every JOB (an executable, no arguments, stdin from /dev/null), LANES at a time: each lane
# takes the next JOB nobody has started, in the order given, until none is left. For each job,
# NAME being its file name without .sh:
#   DIR/NAME.log      its output (stdout and stderr)
#   DIR/NAME.result   "RESULT SECONDS" once it has ended: pass (exit 0), skip (exit 77: it cannot
#                     run here) or fail (any other status); a job without one never ended
# and its whole output is printed between "===== linux-vm-tests: NAME" lines when it ends, one job
# at a time, so that the outputs of jobs side by side never interleave.
# Jobs side by side must not pick the same loopback port: lane K of LANES exports TEST_PORT_RANGE,
# the K-th of LANES equal parts of 10000-31999 (below the kernel's ephemeral range), which
# free_port (scripts/lib/ports.sh) draws from. Returns when every lane has ended; on SIGINT or
# SIGTERM it stops every lane and the job it runs (SIGTERM: a job's exit trap still runs), then
# exits 130.
lanes_run() {
    local dir=$1 lanes=$2 lane
    shift 2
    local -a lane_jobs=("$@") lane_pids=()
    ((lanes > ${#lane_jobs[@]})) && lanes=${#lane_jobs[@]}
    echo 0 >"$dir/next"
    trap 'for pid in "${lane_pids[@]}"; do pkill -TERM -P "$pid" 2>/dev/null || true; kill -TERM "$pid" 2>/dev/null || true; done; exit 130' INT TERM
    for ((lane = 0; lane < lanes; lane++)); do
        _lanes_lane "$dir" "$lane" "$lanes" "${lane_jobs[@]}" &
        lane_pids+=($!)
    done
    for pid in "${lane_pids[@]}"; do wait "$pid" || true; done
    trap - INT TERM
}

# _lanes_next DIR COUNT: the index of the next job nobody has started; fails when all have.
_lanes_next() {
    local i
    {
        flock 8
        i=$(<"$1/next")
        echo $((i + 1)) >"$1/next"
    } 8>>"$1/next.lock"
    ((i < $2)) && echo "$i"
}

# _lanes_lane DIR K LANES JOB...: lane K's loop.
_lanes_lane() {
    local dir=$1 lane=$2 lanes=$3 i job name start rc result
    shift 3
    local width=$((22000 / lanes))
    export TEST_PORT_RANGE=$((10000 + lane * width))-$((10000 + (lane + 1) * width - 1))
    while i=$(_lanes_next "$dir" $#); do
        job=${*:i+1:1}
        name=$(basename "$job" .sh)
        start=$SECONDS
        rc=0
        "$job" </dev/null >"$dir/$name.log" 2>&1 || rc=$?
        case $rc in
            0) result=pass ;;
            77) result=skip ;;
            *) result=fail ;;
        esac
        echo "$result $((SECONDS - start))" >"$dir/$name.result"
        {
            flock 9
            echo "===== linux-vm-tests: $name (lane $lane, ports $TEST_PORT_RANGE) ====="
            cat "$dir/$name.log"
            echo "===== linux-vm-tests: $name: $result ($((SECONDS - start)) s) ====="
        } 9>>"$dir/print.lock"
    done
}
