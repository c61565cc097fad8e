# shellcheck shell=bash
# Guest side of jobs/iser-libiscsi.sh: libiscsi's iSER client (the one QEMU's iser:// disks use)
# over soft iWARP (siw) against `iscsi target --iser` on the host, reached as 10.0.2.100:PORT.
# siw up (siw-up.sh); the memlock limit raised (libiscsi registers its buffers: pinned pages);
# Debian's iscsi-inq first (libiscsi 1.19: login and a read), then the conformance suite
# `./iscsi-test-cu -d --test=TESTS URL URL` (libiscsi 1.20, built on the host by build-libiscsi;
# the second URL for the multipath tests).
# Writes to out/: libiscsi-bin.version, inq.txt, cu-ours.log (the suite's output), cu-ours.rc (its
# exit status: 139 is a segfault), cu-ours.seconds, dmesg.txt. Judging is the host's: this script
# fails only when iscsi-inq fails or the suite could not be started at all.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
set -uo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mkdir -p out
# shellcheck disable=SC1091 # written by the host job
. ./params.sh # PORT, IQN, TESTS (iscsi-test-cu --test), SUITE_S (the suite's time limit),
# LIBISCSI_LOG (libiscsi's log level, LIBISCSI_DEBUG: 0 quiet, 3 its iSER work completions)
say() { echo "iser-libiscsi guest: $*"; }
fail() {
    say "FAIL: $*"
    echo "--- kernel log (tail):"; dmesg | tail -25
    dmesg >out/dmesg.txt
    exit 1
}
dpkg-query -W -f '${Version}\n' libiscsi-bin >out/libiscsi-bin.version
sh ./siw-up.sh ./siw.ko >out/siw-up.txt 2>&1 || { cat out/siw-up.txt; fail "soft iWARP (siw) up"; }
say "$(tail -1 out/siw-up.txt)"
# libiscsi's iSER layer registers its receive and data buffers (ibv_reg_mr pins them): with the
# default 8 MiB memlock limit the login fails to set up its queue pair.
ulimit -l unlimited
url=iser://10.0.2.100:$PORT/$IQN/0
iscsi-inq "$url" >out/inq.txt 2>&1 || { cat out/inq.txt; fail "iscsi-inq $url"; }
say "iscsi-inq over iSER: $(grep -i 'product' out/inq.txt | head -1 | tr -s ' ')"
# One run of the suite per pattern: libiscsi 1.20's iscsi-test-cu segfaults at once when --test is
# given a long list. out/cu-ours.rc gets "PATTERN STATUS" per run; every run ends in its own summary.
# LIBISCSI_CACHE_ALLOCATIONS=0: libiscsi frees some buffers into its small-allocation cache at the
# wrong size (fixed upstream after 1.20.0), which corrupts its heap later.
# A run that ends before its summary, neither passing nor timed out (a segfault, exit 139, or a
# login that libiscsi gives up on, exit 255, after its iSER layer saw a failed work completion), runs
# once more: libiscsi's iSER client does this by itself about one suite in three in the emulated guest
# (siw; seen with no error in the target's log, and after the target refused a Send whose CRC was
# bad). The first attempt's output goes to out/cu-retried.log and "PATTERN STATUS" to
# out/cu-ours.retried, which the host prints; a second failure is the run's result.
say "iscsi-test-cu -d --test=PATTERN $url, for each of $TESTS"
run_pattern() {
    LIBISCSI_DEBUG=$LIBISCSI_LOG LIBISCSI_CACHE_ALLOCATIONS=0 timeout "$SUITE_S" \
        ./iscsi-test-cu -d --test="$1" "$url" "$url" >out/attempt.log 2>&1
}
start=$(date +%s)
: >out/cu-ours.log
: >out/cu-ours.rc
: >out/cu-ours.retried
: >out/cu-retried.log
for pattern in ${TESTS//,/ }; do
    echo "=== iscsi-test-cu -d --test=$pattern" >>out/cu-ours.log
    rc=0
    run_pattern "$pattern" || rc=$?
    if [ "$rc" != 0 ] && [ "$rc" != 124 ] && ! grep -qE '^\s+tests\s' out/attempt.log; then
        say "$pattern: exit $rc before its summary; once more"
        { echo "=== iscsi-test-cu -d --test=$pattern (exit $rc)"; cat out/attempt.log; } >>out/cu-retried.log
        echo "$pattern $rc" >>out/cu-ours.retried
        rc=0
        run_pattern "$pattern" || rc=$?
    fi
    cat out/attempt.log >>out/cu-ours.log
    echo "$pattern $rc" >>out/cu-ours.rc
    [ "$rc" = 0 ] || say "$pattern: exit $rc"
done
rm -f out/attempt.log
echo $(($(date +%s) - start)) >out/cu-ours.seconds
say "the suite ran $(cat out/cu-ours.seconds) s"
dmesg >out/dmesg.txt
exit 0
