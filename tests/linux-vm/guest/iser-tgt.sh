# shellcheck shell=dash
# Guest side of jobs/iser-tgt.sh: tgt's iSER target (tgtd --iser) over soft iWARP (siw) for our
# initiator on the host, which reaches the guest's port 3260 through `run --from-host H:3260`.
# siw up (siw-up.sh); tgtd with its TCP portal moved to 3262 (iSER listens on 3260 in the same TCP
# port space) and a 64 MiB RDMA pool (its default 1 GiB does not register in a 2 GiB guest); one
# target on the iser LLD, LUN 1 a 1 GiB sparse file on the root disk (qemu -snapshot: not guest RAM),
# bound to ALL addresses and to the initiator names in INITIATORS (see the ACL note below). Then writes ./ready (the share: the host sees it at once) and waits for the host's
# ./done (or ./abort), keeping tgtd's log; at the end tgtd's view and the kernel log go to out/.
# ./tgtd, when the host put one here (tgt with tgt/iser-login-race.patch, see jobs/iser-tgt.sh), runs
# in place of the packaged tgtd.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
set -uo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mkdir -p out
# shellcheck disable=SC1091 # written by the host job
. ./params.sh # IQN, INITIATORS (names allowed in), WAIT_S (how long to wait for the host), TGTD_DEBUG (tgtd -d: 0 or 1)
say() { echo "iser-tgt guest: $*"; }
fail() {
    say "FAIL: $*"
    echo "--- tgtd's log (tail):"; tail -30 out/tgtd.log 2>/dev/null
    echo "--- listening sockets:"; ss -tln 2>&1
    echo "--- kernel log (tail):"; dmesg | tail -25
    echo "failed: $*" >./failed
    exit 1
}
sh ./siw-up.sh ./siw.ko >out/siw-up.txt 2>&1 || { cat out/siw-up.txt; fail "soft iWARP (siw) up"; }
say "$(tail -1 out/siw-up.txt)"

# tgtd pins its RDMA pool: no memlock limit.
ulimit -l unlimited
tgtd_bin=tgtd
[ -x ./tgtd ] && tgtd_bin=./tgtd
say "tgtd: $tgtd_bin"
"$tgtd_bin" -f -d "${TGTD_DEBUG:-0}" --iscsi portal=0.0.0.0:3262 --iser pool_sz_mb=64 >out/tgtd.log 2>&1 &
tgtd_pid=$!
i=0
until tgtadm --op show --mode sys >/dev/null 2>&1; do
    kill -0 "$tgtd_pid" 2>/dev/null || fail "tgtd exited at start"
    i=$((i + 1)); [ "$i" -lt 100 ] || fail "tgtd's control socket does not answer"
    sleep 0.2
done
# tgt prints which LLDs came up; iser must be ready.
tgtadm --op show --mode sys >out/tgt-sys.txt 2>&1
grep -Eq '^[[:space:]]*iser: ready' out/tgt-sys.txt || { cat out/tgt-sys.txt; fail "tgtd's iser driver is not ready (see out/tgtd.log)"; }
truncate -s 1G /var/tmp/tgt-lun.img
tgtadm --lld iser --op new --mode target --tid 1 -T "$IQN" || fail "tgtadm: new target"
tgtadm --lld iser --op new --mode logicalunit --tid 1 --lun 1 -b /var/tmp/tgt-lun.img || fail "tgtadm: new LUN"
tgtadm --lld iser --op bind --mode target --tid 1 -I ALL || fail "tgtadm: bind ALL"
# tgt 1.0.85's iSER login (and SendTargets) wants the initiator's address AND its name on the ACLs:
# without an initiator-name ACL every iSER login fails "target not found" (status 02/03), discovery
# lists nothing. Fixed upstream in 1.0.95 (b73c64d, "allow undefined initiator name ACL").
for name in $INITIATORS; do
    tgtadm --lld iser --op bind --mode target --tid 1 -Q "$name" || fail "tgtadm: bind initiator name $name"
done
# siw listens in the kernel's TCP port space: the iSER portal shows as a TCP listener on 3260.
i=0
until [ -n "$(ss -Htln 'sport = :3260' 2>/dev/null)" ]; do
    i=$((i + 1)); [ "$i" -lt 50 ] || fail "nothing listens on port 3260 (tgt's iSER portal over siw)"
    sleep 0.2
done
ss -tln >out/listening.txt
tgtadm --lld iser --op show --mode target >out/tgt-target.txt 2>&1
say "tgtd up: iSER target $IQN LUN 1 on port 3260"
echo "IQN=$IQN" >./ready

# The host runs its checks now; it writes ./done (or ./abort) when finished.
i=0
while [ ! -e ./done ] && [ ! -e ./abort ]; do
    kill -0 "$tgtd_pid" 2>/dev/null || fail "tgtd died while the host was testing"
    i=$((i + 1)); [ "$i" -lt $((WAIT_S * 5)) ] || fail "no ./done from the host after ${WAIT_S}s"
    sleep 0.2
done
tgtadm --lld iser --op show --mode conn --tid 1 >out/tgt-conn.txt 2>&1 || true
dmesg >out/dmesg.txt
tgtadm --op delete --mode system >/dev/null 2>&1 || true
kill -KILL "$tgtd_pid" 2>/dev/null
wait "$tgtd_pid" 2>/dev/null
say "done"
[ -e ./done ] || exit 1
exit 0
