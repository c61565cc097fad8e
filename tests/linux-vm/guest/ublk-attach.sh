# shellcheck shell=bash
# Guest side of jobs/ublk-attach.sh: `iscsi attach` (our initiator as a ublk block device) against
# `iscsi target` on the host. mkfs.ext4 on /dev/ublkbN, a tree copied in with its checksums, fsck
# -fn clean, fio randwrite+verify at QD32 in the file system; `iscsi detach`, attach again, the tree
# intact, ended by SIGTERM; `iscsi attach` of the attached LUN refused. Then the bad case: the host kills the target
# while attached; a read must fail with an I/O error within the session's command timeout (no hung
# process) and `iscsi detach` must still end the device and its server; a server killed with
# SIGKILL under writes leaves its device behind, which `iscsi detach` deletes, and loses no
# acknowledged write. Last, when open-iscsi is
# there, the same fio jobs through the kernel's initiator and through ublk against a second target,
# for a side-by-side table (out/compare.txt).
# Handshake through the shared directory: the guest writes out/kill-target, the host kills the
# target and writes ./target-killed.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
# shellcheck source=open-iscsi-lib.sh
. ./open-iscsi-lib.sh
# shellcheck disable=SC1091 # written by the host job
. ./params.sh # PORT, IQN, PORT2, IQN2, ATTACH_RUST_LOG, BENCH_ROUNDS
# shellcheck disable=SC2153 # PORT and IQN come from params.sh
url=iscsi://10.0.2.100:$PORT/$IQN/0
# Seconds a command may take before it fails (iscsi --timeout): the bad case's bound.
TIMEOUT=10
# The session's replacement timeout in the dead-target case (`iscsi attach` defaults to 120 s).
REPLACEMENT=6

modprobe ublk_drv || fail "no ublk_drv in this kernel ($(uname -r))"
[ -e /dev/ublk-control ] || fail "/dev/ublk-control missing after modprobe"
ok "ublk_drv loaded ($(uname -r))"

attach_pid=
# diagnose: where the attach process's threads are, in the kernel (to stderr and out/).
diagnose() {
    local t
    {
        ls -l /dev/ublk* || true
        for t in /proc/"$attach_pid"/task/*; do
            echo "--- thread ${t##*/} $(cat "$t/comm" 2>/dev/null) wchan $(cat "$t/wchan" 2>/dev/null)"
            cat "$t/stack" 2>/dev/null || true
        done
        cat out/attach-*.log
    } 2>&1 | tee out/diagnose.txt >&2
}
# attach N [ARGS]: `iscsi attach ... ARGS` in the background; sets dev once it printed the device (60 s at most).
# Its commands time out after ATTACH_TIMEOUT seconds if given, else TIMEOUT; ATTACH_QUEUES queues (2).
attach() {
    local n=$1 _
    shift
    RUST_LOG=${ATTACH_RUST_LOG:-info} ./iscsi attach "$url" --queues "${ATTACH_QUEUES:-2}" --depth 64 --timeout "${ATTACH_TIMEOUT:-$TIMEOUT}" "$@" >"out/attach-$n.out" 2>"out/attach-$n.log" &
    attach_pid=$!
    for _ in $(seq 1 600); do
        dev=$(head -1 "out/attach-$n.out" 2>/dev/null || true)
        [ -n "$dev" ] && [ -b "$dev" ] && return 0
        kill -0 "$attach_pid" 2>/dev/null || { cat "out/attach-$n.log" >&2; fail "iscsi attach ($n) exited"; }
        sleep 0.1
    done
    diagnose
    fail "iscsi attach ($n) printed no device within 60 s"
}
# detach N: `iscsi detach`, then the server must end by itself within 30 s, with status 0 unless
# the second argument allows a failure (the bad case: its logout cannot reach the dead target).
detach() {
    local n=$1 may_fail=${2:-} start=$SECONDS rc=0 _
    ./iscsi detach "$dev" || fail "iscsi detach $dev ($n)"
    for _ in $(seq 1 300); do
        kill -0 "$attach_pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$attach_pid" 2>/dev/null && fail "iscsi attach ($n) still runs 30 s after detach"
    wait "$attach_pid" || rc=$?
    [ -e "$dev" ] && fail "$dev still there after detach ($n)"
    if [ -z "$may_fail" ] && [ "$rc" != 0 ]; then
        cat "out/attach-$n.log" >&2
        fail "iscsi attach ($n) exited $rc after detach"
    fi
    ok "detach ($n): device gone, server ended (exit $rc) in $((SECONDS - start)) s"
}

# Two attaches of the LUN started together: one gets the device, the other is refused (each claims
# the LUN before it looks for a device, so both cannot find none and go on).
./iscsi attach "$url" --timeout "$TIMEOUT" >out/race-a.out 2>out/race-a.log &
race_a=$!
./iscsi attach "$url" --timeout "$TIMEOUT" >out/race-b.out 2>out/race-b.log &
race_b=$!
rc=0
wait -n "$race_a" "$race_b" || rc=$?
[ "$rc" = 0 ] && fail "an attach of the racing pair ended with status 0 while the other still served"
for _ in $(seq 1 600); do
    race_dev=$(head -1 out/race-a.out out/race-b.out 2>/dev/null | grep '^/dev/' || true)
    [ -n "$race_dev" ] && [ -b "$race_dev" ] && break
    sleep 0.1
done
[ -n "$race_dev" ] || { cat out/race-*.log >&2; fail "neither racing attach made a device"; }
grep -qh "being attached\|attached already" out/race-a.log out/race-b.log \
    || { cat out/race-*.log >&2; fail "the losing attach did not say why it was refused"; }
./iscsi detach "$race_dev" || fail "iscsi detach $race_dev (race)"
rc=0
wait "$race_a" || rc=$?
wait "$race_b" || rc=$?
[ -e "$race_dev" ] && fail "$race_dev still there after detach (race)"
ok "two attaches started together: one device ($race_dev), one refused: $(grep -h 'being attached\|attached already' out/race-a.log out/race-b.log | head -1)"

t0=$SECONDS
# Two queues over two connections (MC/S): queue q on connection q. blk-mq maps each of the VM's two
# CPUs to one queue, so a direct write from each CPU uses each queue for certain.
attach 1 --connections 2
for cpu in 0 1; do
    taskset -c "$cpu" dd if=/dev/zero of="$dev" bs=4k count=8 seek=$((cpu * 8)) oflag=direct 2>/dev/null \
        || fail "a direct write from CPU $cpu to $dev"
done
note "attached as $dev: $(blockdev --getsize64 "$dev") bytes, logical $(blockdev --getss "$dev"), physical $(blockdev --getpbsz "$dev"), $(cat /sys/block/"${dev#/dev/}"/queue/write_cache) cache, max $(cat /sys/block/"${dev#/dev/}"/queue/max_sectors_kb) KiB, discard max $(cat /sys/block/"${dev#/dev/}"/queue/discard_max_bytes)"
ok "iscsi attach: $dev in $((SECONDS - t0)) s"

# A second attach of the same LUN is refused, naming the device.
rc=0
./iscsi attach "$url" --timeout "$TIMEOUT" >out/attach-twice.out 2>out/attach-twice.log || rc=$?
if [ "$rc" = 0 ] || ! grep -q "attached already as $dev" out/attach-twice.log; then
    cat out/attach-twice.log >&2
    fail "a second attach of the LUN was not refused (exit $rc)"
fi
ok "a second attach of the same LUN is refused: $(head -1 out/attach-twice.log)"

check "mkfs.ext4" mkfs.ext4 -q -F "$dev"
mkdir -p /mnt/u
mount "$dev" /mnt/u
cp -a /usr/lib/python3 /mnt/u/tree
(cd /mnt/u/tree && find . -type f -print0 | sort -z | xargs -0 sha256sum) >out/tree.sha256
note "copied $(wc -l <out/tree.sha256) files ($(du -sh /mnt/u/tree | cut -f1))"
fio --name=ublk --filename=/mnt/u/fio.dat --size=64M --ioengine=libaio --direct=1 --iodepth=32 \
    --rw=randwrite --bs=4k --verify=crc32c --verify_fatal=1 --output=out/fio-verify.txt >/dev/null 2>&1 \
    || { cat out/fio-verify.txt >&2; fail "fio randwrite+verify QD32 in ext4 on $dev"; }
grep -q 'err= 0' out/fio-verify.txt || fail "fio reports errors"
ok "fio randwrite 4k QD32 with crc32c verify in ext4 on $dev: $(awk '/WRITE: bw=/ {print $2; exit}' out/fio-verify.txt)"
# DISCARD through UNMAP (noted, not required: a LUN need not offer UNMAP).
fstrim -v /mnt/u >out/fstrim.txt 2>&1 || true
note "fstrim: $(cat out/fstrim.txt)"
umount /mnt/u
check "fsck.ext4 -fn clean" fsck.ext4 -fn "$dev"
detach 1
# Each of the two queues kept to its connection, and both carried commands: "[(0, N), (1, M)]".
carried=$(grep -o 'per_connection=\[[^]]*\]' out/attach-1.log | tail -1)
echo "$carried" | grep -Eq '^per_connection=\[\(0, [1-9][0-9]*\), \(1, [1-9][0-9]*\)\]$' \
    || { cat out/attach-1.log >&2; fail "MC/S: the two queues did not use both connections ($carried)"; }
ok "MC/S under ublk: commands by connection (CID, count) $carried"

attach 2
mount "$dev" /mnt/u
(cd /mnt/u/tree && sha256sum --quiet -c "$OLDPWD/out/tree.sha256") || fail "the tree changed across detach/attach"
ok "after detach and a new attach: $(wc -l <out/tree.sha256) files intact (sha256)"
umount /mnt/u
check "fsck.ext4 -fn clean after the new attach" fsck.ext4 -fn "$dev"

# SIGTERM ends it as `iscsi detach` does: device gone, flush, logout, exit 0.
kill -TERM "$attach_pid"
rc=0
for _ in $(seq 1 300); do kill -0 "$attach_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$attach_pid" 2>/dev/null && fail "iscsi attach (2) still runs 30 s after SIGTERM"
wait "$attach_pid" || rc=$?
[ -e "$dev" ] && fail "$dev still there after SIGTERM"
[ "$rc" = 0 ] || { cat out/attach-2.log >&2; fail "iscsi attach (2) exited $rc after SIGTERM"; }
ok "SIGTERM: device gone, server ended with status 0"

# The bad case: the target dies under the attached device.
attach 3 --replacement-timeout "$REPLACEMENT"
dd if="$dev" of=/dev/null bs=1M count=4 iflag=direct 2>/dev/null || fail "read before the kill"
touch out/kill-target
for _ in $(seq 1 600); do [ -e target-killed ] && break; sleep 0.1; done
[ -e target-killed ] || fail "the host did not kill the target"
start=$SECONDS
rc=0
timeout 300 dd if="$dev" of=/dev/null bs=4k count=1 skip=12345 iflag=direct 2>out/dead-read.txt || rc=$?
took=$((SECONDS - start))
[ "$rc" = 124 ] && fail "a read on $dev with the target dead hung for 300 s"
[ "$rc" != 0 ] || fail "a read on $dev with the target dead succeeded"
grep -qi 'error' out/dead-read.txt || { cat out/dead-read.txt >&2; fail "the read did not fail with an I/O error"; }
ok "target dead: the read failed after $took s ($(tail -1 out/dead-read.txt)); --replacement-timeout $REPLACEMENT"
# The replacement timeout has run out: the next read fails at once instead of waiting it out again.
start_ms=$(date +%s%3N)
rc=0
timeout 60 dd if="$dev" of=/dev/null bs=4k count=1 skip=54321 iflag=direct 2>out/dead-read-2.txt || rc=$?
took_ms=$(($(date +%s%3N) - start_ms))
[ "$rc" != 0 ] || fail "a second read on $dev with the target dead succeeded"
# Waiting the timeout out again would take $REPLACEMENT s; half that leaves the emulated VM's slowness
# (a dd's start alone took 0.2-0.9 s here) far from deciding the outcome.
[ "$took_ms" -lt $((REPLACEMENT * 500)) ] || fail "the second read with the target dead took $took_ms ms: it should fail at once"
ok "target still dead: the next read failed in $took_ms ms"
detach 3 may-fail

# A server killed outright (SIGKILL: no clean stop) in the middle of heavy writes: the writer gets an
# error instead of hanging, the device left behind is deleted by detach, and every write acknowledged
# before the kill is on the LUN (read back through a new attach).
url=iscsi://10.0.2.100:$PORT2/$IQN2/0
head -c 128M /dev/urandom >/tmp/pattern.bin
attach 5
dd if=/tmp/pattern.bin of="$dev" bs=64k oflag=direct 2>out/killed-dd.txt &
dd_pid=$!
sleep 0.5
kill -KILL "$attach_pid"
wait "$attach_pid" || true
for _ in $(seq 1 600); do kill -0 "$dd_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$dd_pid" 2>/dev/null && fail "a writer to $dev still hangs 60 s after its server was killed"
rc=0
wait "$dd_pid" || rc=$?
[ "$rc" = 0 ] && fail "the writer finished before the kill: nothing was in flight (make the pattern bigger)"
acked=$(sed -n 's/^\([0-9]*\)+[0-9]* records out$/\1/p' out/killed-dd.txt)
[ -n "$acked" ] || { cat out/killed-dd.txt >&2; fail "dd did not say how many writes completed"; }
./iscsi detach "$dev" 2>out/detach-orphan.log || { cat out/detach-orphan.log >&2; fail "iscsi detach of a killed server's $dev"; }
id=${dev#/dev/ublkb}
[ -e "/dev/ublkc$id" ] && fail "/dev/ublkc$id still there after detach of a killed server's device"
ok "a server killed under writes: the writer failed (exit $rc) after $acked acknowledged 64 KiB writes; device deleted by detach: $(cat out/detach-orphan.log)"
attach 6
cmp -n $((acked * 65536)) /tmp/pattern.bin "$dev" || fail "a write acknowledged before the kill is not on the LUN"
detach 6
ok "all $acked writes acknowledged before the kill are on the LUN"
rm -f /tmp/pattern.bin

# Side by side, when the image has open-iscsi: the kernel's initiator and ours on the same
# target (a second RAM LUN on the host), 4 KiB randread/randwrite QD32 and 1 MiB sequential, in
# BENCH_ROUNDS interleaved rounds (params.sh; 1 in CI), each side's median over the rounds and our
# ratio to the kernel's. Ours with one queue (attach's default: the queue and the session on one
# thread), like open-iscsi's one session of one connection.
if [ -n "${PORT2:-}" ] && command -v iscsiadm >/dev/null; then
    url=iscsi://10.0.2.100:$PORT2/$IQN2/0
    bench() { # NAME DEV ROUND: the four fio runs, a JSON file each
        local name=$1 d=$2 round=$3 rw bs
        for spec in randread:4k randwrite:4k read:1m write:1m; do
            rw=${spec%:*} bs=${spec#*:}
            fio --name="$name-$rw-$bs" --filename="$d" --ioengine=libaio --direct=1 --iodepth=32 \
                --rw="$rw" --bs="$bs" --size=256M --runtime=10 --time_based=1 --output-format=json \
                --output="out/bench-$name-$rw-$bs-$round.json" >/dev/null 2>&1 || fail "fio $name $rw $bs"
        done
    }
    start_iscsid
    P=10.0.2.100:$PORT2
    node_new "$IQN2" "$P"
    for round in $(seq 1 "${BENCH_ROUNDS:-1}"); do
        # Not the bad case's 10 s: 32 writes of 1 MiB queued in the emulated guest wait their turn
        # for longer than that when a second VM shares the machine (CI runs two jobs side by side),
        # and the bench is a comparison, not a bound.
        ATTACH_QUEUES=1 ATTACH_TIMEOUT=120 attach "4-$round"
        bench ublk "$dev" "$round"
        detach "4-$round"
        login "$IQN2" "$P"
        kdev=$(disk "$IQN2" 0)
        bench open-iscsi "$kdev" "$round"
        logout "$IQN2" "$P"
    done
    python3 - out >out/compare.txt <<'PY'
import glob, json, statistics, sys
rows = {}
for path in sorted(glob.glob(f"{sys.argv[1]}/bench-*.json")):
    j = json.load(open(path))["jobs"][0]
    name, rw, bs = j["jobname"].rsplit("-", 2)
    side = j["read"] if j["read"]["io_bytes"] else j["write"]
    rows.setdefault((rw, bs), {}).setdefault(name, []).append(
        (side["iops"], side["bw"] / 1024, side["clat_ns"]["mean"] / 1000))
print(f"{'':10} {'':4} {'ublk IOPS':>10} {'kernel IOPS':>12} {'ratio':>6} "
      f"{'ublk MiB/s':>10} {'kernel MiB/s':>12} {'ublk clat us':>12} {'kernel clat us':>14}  rounds")
for (rw, bs), sides in rows.items():
    u, k = sides.get("ublk", []), sides.get("open-iscsi", [])
    if not u or not k:
        continue
    med = lambda runs, i: statistics.median(r[i] for r in runs)
    print(f"{rw:10} {bs:4} {med(u, 0):10.0f} {med(k, 0):12.0f} {med(u, 0) / med(k, 0):6.2f} "
          f"{med(u, 1):10.1f} {med(k, 1):12.1f} {med(u, 2):12.0f} {med(k, 2):14.0f}  {len(u)}")
PY
    echo "side by side (emulated guest: relative figures only; medians of ${BENCH_ROUNDS:-1} rounds):"
    cat out/compare.txt
fi
dmesg >out/dmesg.txt
echo "UBLK OK"
