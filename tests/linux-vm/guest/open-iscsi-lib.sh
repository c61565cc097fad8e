# shellcheck shell=dash
# Guest-side helpers of the open-iscsi jobs (sourced by tests/linux-vm/guest/open-iscsi-*.sh inside
# the VM, from the working directory /mnt/host; bash). Results go to ./out/ (./vm-out/ on the host).
# Every check prints "ok - WHAT" or "not ok - WHAT"; the host job echoes these lines.
set -euo pipefail
# shellcheck source=scripts/lib/on-error.sh # put beside this script by tests/linux-vm/run
. ./on-error.sh
mkdir -p out
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

ok() { echo "ok - $*"; }
# fail WHAT: reports to stderr (also inside $(...)), with the sessions and the kernel log's tail.
fail() {
    {
        echo "not ok - $*"
        echo "--- sessions:"; iscsiadm -m session -P 1 2>&1 | head -40 || true
        echo "--- kernel log (tail):"; dmesg | tail -25 || true
    } >&2
    exit 1
}
# check WHAT COMMAND...: runs COMMAND; ok if it succeeds, fail otherwise.
check() { local what=$1; shift; if "$@"; then ok "$what"; else fail "$what"; fi; }
note() { echo "# $*"; }

# Starts iscsid and waits until iscsiadm can talk to it (exit 21: "no sessions" is the good answer).
start_iscsid() {
    iscsid
    local _ rc
    for _ in $(seq 1 50); do
        rc=0; iscsiadm -m session >/dev/null 2>&1 || rc=$?
        [ "$rc" = 0 ] || [ "$rc" = 21 ] && return 0
        sleep 0.2
    done
    fail "iscsid does not answer"
}

# node_new IQN PORTAL: a node record for IQN reached through PORTAL (10.0.2.100:PORT: the forward to
# the host; SendTargets answers with the host's own 127.0.0.1 portal, useless from here).
node_new() { iscsiadm -m node -o new -T "$1" -p "$2" >/dev/null; }
# node_set IQN PORTAL NAME VALUE: one setting of the node record (applies to the next login).
node_set() { iscsiadm -m node -T "$1" -p "$2" -o update -n "$3" -v "$4"; }
node_delete() { iscsiadm -m node -T "$1" -p "$2" -o delete >/dev/null 2>&1 || true; }
login() { iscsiadm -m node -T "$1" -p "$2" --login >/dev/null; }
logout() { iscsiadm -m node -T "$1" -p "$2" --logout >/dev/null; }

# session_dir IQN: the sysfs directory of the (one) session to IQN.
session_dir() {
    local s
    for s in /sys/class/iscsi_session/session*; do
        [ -e "$s/targetname" ] && [ "$(cat "$s/targetname")" = "$1" ] && { echo "$s"; return 0; }
    done
    return 1
}

# disk IQN LUN: waits (up to 30 s) for the block device of LUN of the session to IQN, prints /dev/sdX.
disk() {
    local iqn=$1 lun=$2 _ s d
    for _ in $(seq 1 150); do
        if s=$(session_dir "$iqn"); then
            for d in "$s"/device/target*/*:*:*:"$lun"/block/*; do
                [ -e "$d" ] && [ -b "/dev/${d##*/}" ] && { echo "/dev/${d##*/}"; return 0; }
            done
        fi
        sleep 0.2
    done
    fail "no disk for $iqn LUN $lun"
}

# writes_under_way DISK: waits (up to 10 s) until DISK has completed 200 more writes, then tells the
# host through the share (out/fio-started): the handshake of the jobs that disturb a running fio.
writes_under_way() {
    local stat=/sys/block/${1#/dev/}/stat w0 _
    w0=$(awk '{print $5}' "$stat")
    for _ in $(seq 1 100); do
        [ "$(awk '{print $5}' "$stat")" -gt $((w0 + 200)) ] && break
        sleep 0.1
    done
    touch out/fio-started
}

# write_pass_ended PID OUTPUT ACROSS: waits for the fio write pass running in the background as PID
# (its --output OUTPUT) and fails unless it ended without an error; ACROSS names what the jobs that
# disturb a running fio did to it (a restart, a failover, a fence...).
write_pass_ended() {
    local rc=0
    wait "$1" || rc=$?
    cat "$2"
    [ "$rc" = 0 ] || fail "the fio write pass failed across $3 (exit $rc)"
    grep -q 'err= 0' "$2" || fail "fio reports I/O errors across $3"
}

# verify_only_pass OUTPUT ACROSS FIO-OPTIONS...: fio's verify-only pass of the write pass that ran
# with FIO-OPTIONS (--verify_state_save): every write it acknowledged must read back with its
# CRC32C. Its output in OUTPUT.
verify_only_pass() {
    local output=$1 across=$2
    shift 2
    if fio "$@" --verify_only --verify_state_load=1 --output="$output" >/dev/null 2>&1; then
        ok "verify-only pass after $across: every acknowledged write reads back with the right CRC32C"
    else
        tail -30 "$output"
        fail "verify-only pass after $across"
    fi
}

# sg_of DISK: the /dev/sgN of /dev/sdX.
sg_of() { local d; for d in /sys/block/"${1#/dev/}"/device/scsi_generic/*; do echo "/dev/${d##*/}"; return 0; done; return 1; }

# negotiated IQN KEY: a value of `iscsiadm -m session -r SID -P 2` (e.g. HeaderDigest, MaxBurstLength).
negotiated() {
    local s sid
    s=$(session_dir "$1") || return 1
    sid=${s##*session}
    iscsiadm -m session -r "$sid" -P 2 | awk -v k="$2:" '$1==k {print $2; exit}'
}

# fio_verify NAME DISK SIZE BS [fio options...]: random writes over the first SIZE of DISK at
# queue depth 32 (libaio, O_DIRECT), then reads everything back checking CRC32C of every block.
# Extra "--name=X --filename=DEV" pairs run more such jobs at the same time.
fio_verify() {
    local name=$1 dev=$2 size=$3 bs=$4
    shift 4
    # Options before the first --name are global: extra "--name=X --filename=Y" jobs share them.
    local bs_option=--bs=$bs
    [[ $bs != *-* ]] || bs_option=--bsrange=$bs # a range: every size from ... to ...
    if fio --ioengine=libaio --direct=1 --iodepth=32 --rw=randwrite "$bs_option" --size="$size" \
        --verify=crc32c --verify_fatal=1 --do_verify=1 --output="out/fio-$name.txt" \
        --name="$name" --filename="$dev" "$@" >/dev/null 2>&1; then
        ok "fio $name: randwrite+verify crc32c bs=$bs size=$size QD32 on $dev ($(fio_rate "$name"))"
    else
        tail -30 "out/fio-$name.txt" 2>/dev/null
        fail "fio $name: randwrite+verify bs=$bs size=$size on $dev"
    fi
}
fio_rate() { awk '/WRITE: bw=/ {print "write " $2; exit}' "out/fio-$1.txt" 2>/dev/null | tr -d ',' || true; }

# failover_after_kill COUNT FIO-PID DEV [ROUND]: once the host says ./target-killed (within 30 s),
# the time in ms until COUNT (a command printing a count of completed writes) grows, written to
# out/failover-ms and set in $failover_ms; fails if no write completes through DEV in 60 s, or
# fio (FIO-PID) ends first. With ROUND, the host's file is ./target-killed.ROUND.
failover_after_kill() {
    local count=$1 fio_pid=$2 dev=$3 killed=target-killed${4:+.$4} t0 base first= _
    for _ in $(seq 1 600); do [ -e "$killed" ] && break; sleep 0.05; done
    [ -e "$killed" ] || fail "the host did not kill the owner"
    t0=$(date +%s%N)
    base=$($count)
    for _ in $(seq 1 12000); do
        [ "$($count)" -gt "$base" ] && { first=$(date +%s%N); break; }
        kill -0 "$fio_pid" 2>/dev/null || break
        sleep 0.005
    done
    [ -n "$first" ] || fail "no write completed through $dev after the kill"
    failover_ms=$(((first - t0) / 1000000))
    echo "$failover_ms" >out/failover-ms
}

# seconds_of MS: "3.558".
seconds_of() { echo "$(($1 / 1000)).$(printf %03d $(($1 % 1000)))"; }

# restart_killed [ROUND]: asks the host to start the killed target again (out/restart-target) and
# waits for ./target-restarted (120 s at most); with ROUND, each name ends in .ROUND.
restart_killed() {
    local round=${1:+.$1} _
    touch "out/restart-target$round"
    for _ in $(seq 1 1200); do [ -e "target-restarted$round" ] && break; sleep 0.1; done
    [ -e "target-restarted$round" ] || fail "the host did not restart the killed gateway"
}
