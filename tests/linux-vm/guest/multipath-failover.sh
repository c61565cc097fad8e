# shellcheck shell=bash
# Guest side of jobs/multipath-failover.sh: open-iscsi logged in to the two gateways of one gateway
# group (the same RBD image behind both, implicit ALUA), dm-multipath on top (group_by_prio, prio
# alua, the alua hardware handler, tur checker, queue while no path is usable). fio writes at QD32
# to the multipath device; the gateway owning the image (the path that completes the writes) is
# SIGKILLed by the host; fio must see no error, the map's count of completed writes gives the
# time from the kill to the first write completed through the survivor, and a verify-only pass
# must find every acknowledged write. The killed gateway is started again and its path must come
# back (active in the kernel) within 120 s, the two paths one active/optimized (checker: ready) and
# one standby (ghost); the time from the restart to its return is printed. All of it ROUNDS times
# (params.sh), the failovers' min, median and max in the last line.
# Handshake through the share, for round R: the guest writes out/kill-target.R (the port of the
# owner), the host kills it and writes ./target-killed.R; the guest writes out/restart-target.R,
# the host starts it again and writes ./target-restarted.R.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
# shellcheck source=open-iscsi-lib.sh
. ./open-iscsi-lib.sh
# shellcheck disable=SC1091 # written by the host job
. ./params.sh # PORT1, PORT2, IQN, ROUNDS
P1=10.0.2.100:$PORT1
P2=10.0.2.100:$PORT2

# The settings found for this group: ALUA priorities group the owner's path apart from the
# standby's, the tur checker reads the standby's NOT READY 04h/0Bh as "ghost", and I/O is queued
# (never failed) while the survivor is being promoted (about 3 s).
cat >/etc/multipath.conf <<'CONF'
defaults {
    user_friendly_names no
    find_multipaths no
    polling_interval 1
    # How long a broken session tries to reconnect before its I/O fails over: multipathd writes
    # it into every iSCSI session's recovery_tmo, over open-iscsi's replacement_timeout (its
    # own default is 5 s, which was then the failover's floor: 5.2-5.7 s).
    fast_io_fail_tmo 2
}
blacklist {
    devnode "^vd[a-z]"
}
devices {
    device {
        vendor ".*"
        product ".*"
        path_grouping_policy group_by_prio
        prio alua
        hardware_handler "1 alua"
        path_checker tur
        failback immediate
        no_path_retry queue
    }
}
CONF
for m in dm_multipath dm_round_robin scsi_dh_alua; do modprobe "$m"; done
# systemd is PID 1 here (run --systemd: udev, which multipathd needs for the paths' WWIDs).
# iscsid logs its login and reconnect steps (debug level 4) to the journal: out/iscsid.log.
mkdir -p /run/systemd/system/iscsid.service.d
printf '[Service]\nExecStart=\nExecStart=/sbin/iscsid -d 4\n' >/run/systemd/system/iscsid.service.d/debug.conf
systemctl daemon-reload
systemctl start iscsid.service || fail "systemctl start iscsid"
for p in "$P1" "$P2"; do
    node_new "$IQN" "$p"
    # A dead gateway fails its path after 2 s (the session's replacement_timeout, which
    # multipathd sets again from fast_io_fail_tmo), so that dm-multipath retries its I/O on the
    # other path; NOP-Outs notice a silent one.
    node_set "$IQN" "$p" node.session.timeo.replacement_timeout 2
    node_set "$IQN" "$p" 'node.conn[0].timeo.noop_out_interval' 2
    node_set "$IQN" "$p" 'node.conn[0].timeo.noop_out_timeout' 2
    check "login to $p" login "$IQN" "$p"
done

# disk_of PORTAL: the /dev/sdX of LUN 0 of the session through PORTAL.
disk_of() {
    local s d _
    for _ in $(seq 1 150); do
        for s in /sys/class/iscsi_session/session*; do
            for d in "$s"/device/connection*/iscsi_connection/connection*; do
                [ "$(cat "$d/persistent_address" 2>/dev/null):$(cat "$d/persistent_port" 2>/dev/null)" = "$1" ] || continue
                for b in "$s"/device/target*/*:*:*:0/block/*; do
                    [ -b "/dev/${b##*/}" ] && { echo "${b##*/}"; return 0; }
                done
            done
        done
        sleep 0.2
    done
    fail "no disk through $1"
}
sd1=$(disk_of "$P1")
sd2=$(disk_of "$P2")
note "disks: $sd1 through $P1, $sd2 through $P2"

systemctl start multipathd || fail "multipathd does not start"
mp=
for _ in $(seq 1 100); do
    multipath -r >/dev/null 2>&1 || true
    mp=
    for h in /sys/block/"$sd1"/holders/*; do [ -e "$h" ] && mp=${h##*/}; done
    [ -n "$mp" ] && [ -e "/sys/block/$sd2/holders/$mp" ] && break
    mp=
    sleep 0.3
done
multipath -ll >out/multipath-before.txt 2>&1 || true
cat out/multipath-before.txt
[ -n "$mp" ] || fail "dm-multipath did not put $sd1 and $sd2 into one map"
ok "one multipath map $mp over $sd1 and $sd2"
dev=/dev/$mp
# path_state DISK: multipathd's checker state of DISK (%T: ready, ghost, faulty, ...; %t would be
# the kernel's active/failed).
path_state() { multipathd show paths raw format "%d %T" 2>/dev/null | awk -v d="$1" '$1==d {print $2}'; }
# path_dm DISK: the kernel's (dm-multipath's) state of DISK's path: active or failed.
path_dm() { multipathd show paths raw format "%d %t" 2>/dev/null | awk -v d="$1" '$1==d {print $2}'; }
writes() { awk '{print $5}' "/sys/block/$1/stat"; }

# The failover's end is counted on the map (see round).
map_writes() { writes "$mp"; }
job=(--name=mpath --filename="$dev" --ioengine=libaio --direct=1 --iodepth=32 --rw=randwrite
    --bs=16k --size=160M --verify=crc32c --verify_fatal=1 --verify_state_save=1)

# round R: one kill of the owner under a write pass and its verify, then the restart and the return
# of its path (the handshake's files end in .R); appends the failover's ms to out/failovers.txt.
round() {
    local r=$1
    fio "${job[@]}" --do_verify=0 --output=out/fio-write.txt >/dev/null 2>&1 &
    fio_pid=$!
    w1=$(writes "$sd1"); w2=$(writes "$sd2")
    for _ in $(seq 1 100); do
        [ $(($(writes "$sd1") - w1 + $(writes "$sd2") - w2)) -gt 200 ] && break
        sleep 0.1
    done
    d1=$(($(writes "$sd1") - w1)); d2=$(($(writes "$sd2") - w2))
    note "writes completed: $d1 on $sd1, $d2 on $sd2"
    # A flush sent down the standby's path counts as a (failed) write there: a few are allowed.
    if [ "$d1" -gt 200 ] && [ "$d2" -lt 8 ]; then owner=$PORT1 sdo=$sd1 sds=$sd2
    elif [ "$d2" -gt 200 ] && [ "$d1" -lt 8 ]; then owner=$PORT2 sdo=$sd2 sds=$sd1
    else fail "the writes did not all go through one path ($d1 on $sd1, $d2 on $sd2)"; fi
    ok "the owner's path $sdo carries every write, the standby's $sds none (state $(path_state "$sds"))"
    # The failover's end: the first write the map completes after the kill. The map's count, not the
    # survivor's disk's: a disk counts the writes it fails too, the map (queue_if_no_path) completes
    # none but the good ones; the owner's writes in flight at the kill never complete.
    # Written aside and renamed: the host acts on the file as soon as it exists, and once read it empty
    # (the port not yet written through the share: CI, two jobs side by side).
    echo "$owner" >out/kill-target.part
    mv out/kill-target.part "out/kill-target.$r"
    survivor_before=$(writes "$sds")
    failover_after_kill map_writes "$fio_pid" "$dev" "$r"
    ms=$failover_ms
    [ "$(writes "$sds")" -gt "$survivor_before" ] || fail "the survivor's path $sds completed no write"
    ok "failover: the first write completed through the survivor $(seconds_of "$ms") s after the kill"
    write_pass_ended "$fio_pid" out/fio-write.txt "the failover"
    ok "fio wrote 160 MiB at QD32 across the owner's SIGKILL without an I/O error"
    verify_only_pass out/fio-verify.txt "the failover" "${job[@]}"

    restart_killed "$r"
    t1=$(date +%s%N)
    # The path returns when open-iscsi has logged in again (its next reconnect try), the session's
    # disk answers, and multipathd's checker (every polling_interval) sees it: the kernel's path state
    # active again, the checker's ready or ghost as the port's ALUA state says. Bounded at 120 s, far
    # above what it takes (a few seconds plus one reconnect interval).
    back=
    deadline=$(($(date +%s) + 120))
    while [ "$(date +%s)" -lt "$deadline" ]; do
        [ "$(path_dm "$sdo")" = active ] && case $(path_state "$sdo") in ready | ghost) true ;; *) false ;; esac &&
            { back=$(date +%s%N); break; }
        sleep 0.2
    done
    multipath -ll >out/multipath-after.txt 2>&1 || true
    cat out/multipath-after.txt
    if [ -z "$back" ]; then
        ss -tnoi >out/ss.txt 2>&1 || true
        dmesg >out/dmesg.txt
        iscsiadm -m session -P 3 >out/sessions.txt 2>&1 || true
        journalctl -u iscsid --no-pager -o short-precise >out/iscsid.log 2>&1 || true
        fail "the restarted gateway's path $sdo did not return within 120 s (kernel: '$(path_dm "$sdo")', checker: '$(path_state "$sdo")')"
    fi
    rs=$(((back - t1) / 1000000))
    echo "$rs" >out/return-ms
    ok "path return: $sdo active again $(seconds_of "$rs") s after the gateway's restart"
    # One owner: the two paths' ALUA states settle to one active/optimized (ready) and one standby
    # (ghost), the survivor's kernel path active too. multipathd's view of a path that just returned
    # can lag a check behind (seen: both ready for a moment, while multipath -ll's own check said ghost),
    # so this waits for the pair, 30 s at most, and keeps every pair seen in out/states.txt.
    settled=
    rm -f out/states.txt
    deadline=$(($(date +%s) + 30))
    while [ "$(date +%s)" -lt "$deadline" ]; do
        so=$(path_state "$sdo") ss=$(path_state "$sds")
        echo "$(date +%T.%N) $sdo $(path_dm "$sdo") $so, $sds $(path_dm "$sds") $ss" >>out/states.txt
        [ "$(path_dm "$sdo")/$(path_dm "$sds")" = active/active ] &&
            case "$so/$ss" in ghost/ready | ready/ghost) true ;; *) false ;; esac && { settled=1; break; }
        sleep 0.5
    done
    multipath -ll >>out/multipath-after.txt 2>&1 || true
    [ -n "$settled" ] || { cat out/states.txt; fail "30 s after the return the paths are not active with one ready and one ghost (last: $sdo '$so', $sds '$ss')"; }
    [ "$(wc -l <out/states.txt)" = 1 ] || { note "path states until they settled:"; sed 's/^/#   /' out/states.txt; }
    ok "both paths active: $sdo $so, $sds $ss"
    dd if="$dev" of=/dev/null bs=1M count=16 iflag=direct 2>/dev/null || fail "read through $dev after the restart"
    ok "reads through $dev after the restart"
    echo "$ms" >>out/failovers.txt
    echo "$rs" >>out/returns.txt
}

: >out/failovers.txt
: >out/returns.txt
for r in $(seq 1 "${ROUNDS:-1}"); do
    note "round $r of ${ROUNDS:-1}"
    round "$r"
done
# The distribution over the rounds: min, median, max (with 20 rounds, max is the p99 and above).
summary() { sort -n "$1" | awk '{v[NR]=$1} END {printf "%d %d %d", v[1], v[int((NR+1)/2)], v[NR]}'; }
# The kernel's and iscsid's accounts of each failover, for the host to keep.
dmesg >out/dmesg.txt 2>&1 || true
journalctl -u iscsid --no-pager -o short-precise >out/iscsid.log 2>&1 || true
read -r fmin fmed fmax <<<"$(summary out/failovers.txt)"
read -r rmin rmed rmax <<<"$(summary out/returns.txt)"
ok "failovers over ${ROUNDS:-1} kills (ms): $(tr '\n' ' ' <out/failovers.txt)"
echo "MULTIPATH OK rounds=${ROUNDS:-1} failover_ms min=$fmin median=$fmed max=$fmax return_ms min=$rmin median=$rmed max=$rmax"
