#!/usr/bin/env bash
# Our initiator (the `iscsi` binary, run inside the VM) against LIO, the Linux kernel's target, in the
# VM on 127.0.0.1:3260: discover, ls, inquiry, capacity, 64 MiB of random data written, read back and
# compared; with CRC32C header and data digests required by LIO; one-way and mutual CHAP (a wrong
# secret, either way, refused with a clear error); MC/S with LIO's MaxConnections=4, under round-robin
# and LUN-affinity scheduling, the connections used counted on LIO's side (ss -ti). One VM boot; LIO is
# reconfigured per phase by lio-target.py --clear. Last, the parameter study's sweeps against LIO
# and against `iscsi target` in the guest (short by default; LIO_SWEEP_ENV for the full study).
# Guest side: guest/lio-initiator.sh.
# Results (every step's output, timings, dmesg) in $LINUX_VM_RESULTS/lio-initiator/ (default
# <repo>/target/linux-vm-results/lio-initiator/).
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
vm_setup
results=${LINUX_VM_RESULTS:-$LINUX_VM_REPO/target/linux-vm-results}/lio-initiator
cp "$ISCSI_BIN" ./iscsi
# LIO_SWEEP_ENV=FILE: shell assignments (SWEEP_VALUES=..., SWEEP_TIME=...) for the sweep phase, to
# run the full parameter study of docs/analysis.md instead of the short check.
extra=()
if [ -n "${LIO_SWEEP_ENV:-}" ]; then
    cp "$LIO_SWEEP_ENV" ./sweep.env
    extra=(./sweep.env)
fi
# LIO_ERL1_DATA_OUT=1: also the erl1 phase's Data-Out part (corrupted Data-Out recovered with LIO's
# recovery R2Ts). Not run by default: LIO 6.1 leaves commands unanswered on that path and, once in
# about five runs, stops answering the session at all until the job's timeout.
if [ -n "${LIO_ERL1_DATA_OUT:-}" ]; then
    touch ./erl1-data-out
    extra+=(./erl1-data-out)
fi
# LIO_DISRUPT=1: also task management and teardown under load against LIO (`iscsi verify
# --disrupt`, the fault matrix's second table for LIO). Not run by default: it is a comparison, and
# the incumbents' hangs in exactly these paths are what it looks for.
if [ -n "${LIO_DISRUPT:-}" ]; then
    touch ./lio-disrupt
    extra+=(./lio-disrupt)
fi
# LIO_ERL2=1: also ERL 2 connection recovery against LIO (a 4-connection session, one cut at a
# time); off by default: LIO's ERL 2 paths crash the guest kernel, on 6.1 and on the 6.12 and 7.3
# kernels build-image's LINUX_VM_KERNEL can give (see the guest script).
if [ -n "${LIO_ERL2:-}" ]; then
    touch ./lio-erl2
    extra+=(./lio-erl2)
fi
# LIO_FAULTS="ERLS [WORDS...]" (e.g. "0,1", or "1 drop cut"): also the fault matrix's first table
# against LIO at those ERLs, for the faults the words choose (scripts/fault-matrix --peer-url, run in
# the guest); a comparison, not run by default. LIO 6.1 panics at ERL 1 on a Data-Out digest error.
if [ -n "${LIO_FAULTS:-}" ]; then
    echo "$LIO_FAULTS" >./lio-faults
    cp "$LINUX_VM_REPO/scripts/fault-matrix" ./fault-matrix
    extra+=(./lio-faults ./fault-matrix)
fi
rc=0
vm_run --timeout "${LIO_TIMEOUT:-1200}" "$LINUX_VM_DIR/guest/lio-initiator.sh" "$LINUX_VM_DIR/lio-target.py" ./iscsi "${extra[@]}" || rc=$?
rm -f ./iscsi ./erl1-data-out ./lio-disrupt ./lio-erl2 ./lio-faults ./fault-matrix
mkdir -p "$results"
rm -rf "${results:?}"/*
[ -d vm-out ] && cp -r vm-out/. "$results/"
cp console.log "$results/console.log"
grep -E '^(PASS|FAIL) ' console.log || true
[ -f vm-out/timings.txt ] && { echo "seconds per phase (in the VM):"; sed 's/^/  /' vm-out/timings.txt; }
echo "logs: $results"
if ((rc != 0)); then
    for f in vm-out/*.log; do [ -f "$f" ] && grep -q '^FAIL\|\[exit [1-9]' "$f" && { echo "===== tail of $f"; tail -n 30 "$f"; }; done
    vm_fail "the guest script failed (exit $rc)"
fi
vm_log "ok"
