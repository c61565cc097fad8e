#!/usr/bin/env bash
# libiscsi's conformance suite (iscsi-test-cu -d --test=ALL URL URL, the second URL for the multipath
# tests) against three targets, side by side: LIO (the Linux kernel target) in the VM, our
# `iscsi target` on the host (ram:256M + ram:64M, as crates/cli/tests/conformance.rs), and tgtd on the
# host (a 256 MiB file in /dev/shm). Prints tests, passed, failed and "[SKIPPED]" lines per target,
# and every test whose outcome differs between them. Fails if our target fails any test (or if a
# suite did not run to its summary); LIO's and tgt's failures are reported, not judged.
#
# Where the suite runs (CONFORMANCE_MODE):
#   host    (default) on the host against all three, LIO reached through --from-host: one
#           iscsi-test-cu binary for all three, only LIO itself emulated. Measured on a shared 2-core
#           machine: ours 25 s, tgt 23 s, then LIO 279 s (its guest boots meanwhile): ~5.5 min in all.
#   vm-lio  against LIO from inside the VM (the suite emulated too: 394 s), against ours and tgt on
#           the host meanwhile (same libiscsi-bin version in both: checked and printed): ~8 min.
#   vm-all  all three from inside the VM (ours and tgt through --to-host as 10.0.2.100:PORT): slowest.
# Results: $LINUX_VM_RESULTS/conformance/ (default <repo>/target/linux-vm-results/conformance/):
# cu-{ours,lio,tgt}.log (the suites' full output), cu-*.seconds, tests.tsv (one line per test:
# suite.test and the outcome on each target: passed, skipped (passed with a [SKIPPED] line before
# the verdict), FAILED), summary.txt (the table and the differences).
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
vm_setup
results=${LINUX_VM_RESULTS:-$LINUX_VM_REPO/target/linux-vm-results}/conformance
mode=${CONFORMANCE_MODE:-host}
case "$mode" in host | vm-lio | vm-all) ;; *) vm_fail "CONFORMANCE_MODE must be host, vm-lio or vm-all" ;; esac
for tool in tgtd tgtadm iscsi-test-cu; do
    command -v "$tool" >/dev/null || vm_fail "missing $tool: apt-get install -y tgt libiscsi-bin"
done

OUR_NAME=iqn.2026-11.rs.iscsi:conformance
TGT_NAME=iqn.2026-11.test:tgt-conformance
LIO_NAME=iqn.2026-11.org.example:lio
our_port=$(vm_free_port)
TARGET_RUST_LOG=${TARGET_RUST_LOG:-warn} target_start ours "$our_port" --name "$OUR_NAME" --lun ram:256M --lun ram:64M

# tgtd: its own process, stopped on exit before lib.sh's cleanup runs.
tgt_port=$(vm_free_port)
while [ "$tgt_port" = "$our_port" ]; do tgt_port=$(vm_free_port); done
tgt_control=$((tgt_port % 5000 + 22000))
tgt_file=/dev/shm/iscsi-rs-conformance-tgt-$tgt_port.img
truncate -s 256M "$tgt_file"
tgtd -f --iscsi "portal=127.0.0.1:$tgt_port" -C "$tgt_control" >>"$VM_WORK/target-tgt.log" 2>&1 </dev/null &
tgt_pid=$!
# (tgtd -f ignores SIGTERM while it has targets: KILL, as scripts/bench-target does. `|| true`: set -e
# holds in the trap too, and a failing step would skip lib.sh's cleanup.)
trap 'rc=$?; kill -KILL "$tgt_pid" 2>/dev/null || true; wait "$tgt_pid" 2>/dev/null || true; rm -f "$tgt_file"; _vm_exit $rc' EXIT
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$tgt_port") 2>/dev/null && break; sleep 0.1; done
tgtadm -C $tgt_control --lld iscsi --op new --mode target --tid 1 -T $TGT_NAME
tgtadm -C $tgt_control --lld iscsi --op new --mode logicalunit --tid 1 --lun 1 -b "$tgt_file"
tgtadm -C $tgt_control --lld iscsi --op bind --mode target --tid 1 -I ALL

# run_host NAME URL: the suite on the host, as the guest script runs it in the VM.
run_host() {
    local name=$1 url=$2 start=$SECONDS
    vm_log "iscsi-test-cu on the host against $name: $url"
    timeout 1500 iscsi-test-cu -d --test=ALL "$url" "$url" >"vm-out-host/cu-$name.log" 2>&1 || true
    echo $((SECONDS - start)) >"vm-out-host/cu-$name.seconds"
}
mkdir -p vm-out-host
host_version=$(dpkg-query -W -f '${Version}' libiscsi-bin)
rc=0
guest=$LINUX_VM_DIR/guest/conformance.sh
our_url=iscsi://127.0.0.1:$our_port/$OUR_NAME/0
tgt_url=iscsi://127.0.0.1:$tgt_port/$TGT_NAME/1
case "$mode" in
host)
    # LIO serves in the VM until we write share/done; the suites run here one after the other.
    lio_port=$(vm_free_port)
    while [ "$lio_port" = "$our_port" ] || [ "$lio_port" = "$tgt_port" ]; do lio_port=$(vm_free_port); done
    : >serve-lio
    : >targets.txt
    vm_run_bg --from-host "$lio_port:3260" --timeout 1800 "$guest" "$LINUX_VM_DIR/lio-target.py" serve-lio targets.txt
    run_host ours "$our_url"
    run_host tgt "$tgt_url"
    vm_wait_file "$VM_SHARE/out/lio-ready" 600 "$VM_RUN_PID" || vm_fail "LIO did not come up in the VM"
    run_host lio "iscsi://127.0.0.1:$lio_port/$LIO_NAME/0"
    : >"$VM_SHARE/done"
    wait "$VM_RUN_PID" || rc=$?
    ;;
vm-lio)
    echo "lio iscsi://127.0.0.1/$LIO_NAME/0" >targets.txt
    # On the host while the VM boots and runs LIO's suite: the two share the machine, so these
    # suites' seconds are not comparable with LIO's (nor meant as performance figures).
    (run_host ours "$our_url"; run_host tgt "$tgt_url") &
    host_suites=$!
    vm_run --timeout 1800 "$guest" "$LINUX_VM_DIR/lio-target.py" targets.txt || rc=$?
    wait "$host_suites"
    ;;
vm-all)
    {
        echo "lio iscsi://127.0.0.1/$LIO_NAME/0"
        echo "ours iscsi://10.0.2.100:$our_port/$OUR_NAME/0"
        echo "tgt iscsi://10.0.2.100:$tgt_port/$TGT_NAME/1"
    } >targets.txt
    vm_run --to-host "$our_port" --to-host "$tgt_port" --timeout 2400 "$guest" "$LINUX_VM_DIR/lio-target.py" targets.txt || rc=$?
    ;;
esac
mkdir -p vm-out
cp vm-out-host/* vm-out/ 2>/dev/null || true
guest_version=$(cat vm-out/libiscsi-bin.version 2>/dev/null || echo unknown)

mkdir -p "$results"
rm -rf "${results:?}"/*
cp -r vm-out/. "$results/"
cp console.log "$results/console.log"
[ "$rc" = 0 ] || echo "conformance: the guest script failed (exit $rc)" >&2

# The table, the per-test outcomes (tests.tsv) and the differences.
python3 - "$results" "$host_version" "$guest_version" "$mode" >"$results/summary.txt" <<'PY'
import os, re, sys
results, host_version, guest_version, mode = sys.argv[1:5]
names = ["ours", "lio", "tgt"]
where = {"ours": "host", "lio": "host", "tgt": "host"}
if mode in ("vm-lio", "vm-all"):
    where["lio"] = "VM"
if mode == "vm-all":
    where["ours"] = where["tgt"] = "VM"

def parse(path):
    """Per-test outcome and the summary numbers of one iscsi-test-cu log."""
    outcome, order, suite, test, buf = {}, [], "?", None, ""
    summary = None
    def close():
        # CUnit's verdict for a test is the first line (counting the rest of the "Test: X ..." line)
        # that starts with "passed" or "FAILED"; what the test logged comes before it ("[SKIPPED]
        # ..." makes it "skipped"), and what follows it on that line belongs to the next test.
        if test is not None:
            key = f"{suite}.{test}"
            st, before = "?", []
            for l in buf.split("\n"):
                m = re.match(r"^(passed|FAILED)\b", l)
                if m:
                    st = m.group(1)
                    break
                before.append(l)
            if st == "passed" and any("[SKIPPED]" in l for l in before):
                st = "skipped"
            outcome[key] = st
            order.append(key)
    try:
        lines = open(path, errors="replace").read().splitlines()
    except FileNotFoundError:
        return None
    text = "\n".join(lines)
    for line in lines:
        m = re.match(r"^Suite: (.*)$", line)
        if m:
            close(); test, buf = None, ""; suite = m.group(1).strip(); continue
        m = re.match(r"^  Test: (.*?) \.\.\.(.*)$", line)
        if m:
            close(); test, buf = m.group(1).strip(), m.group(2); continue
        if line.startswith("Run Summary"):
            close(); test = None; continue
        if test is not None:
            buf += "\n" + line
        m = re.match(r"^\s+tests\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", line)
        if m:
            summary = tuple(int(x) for x in m.groups())
    close()
    return {"outcome": outcome, "order": order, "summary": summary,
            "skipped": text.count("[SKIPPED]")}

runs = {n: parse(os.path.join(results, f"cu-{n}.log")) for n in names}
secs = {}
for n in names:
    try:
        secs[n] = open(os.path.join(results, f"cu-{n}.seconds")).read().strip()
    except FileNotFoundError:
        secs[n] = "?"
print(f"libiscsi-bin (iscsi-test-cu): host {host_version}, VM {guest_version}"
      + ("" if host_version == guest_version else "  <-- VERSIONS DIFFER"))
print(f"{'':10}{'ours':>12}{'LIO':>12}{'tgt':>12}")
def row(label, f):
    print(f"{label:10}" + "".join(f"{f(runs[n]) if runs[n] else 'no log':>12}" for n in names))
row("tests", lambda r: r["summary"][0] if r["summary"] else "no summary")
row("passed", lambda r: r["summary"][2] if r["summary"] else "-")
row("failed", lambda r: r["summary"][3] if r["summary"] else "-")
row("[SKIPPED]", lambda r: r["skipped"])
print(f"{'ran in':10}" + "".join(f"{where[n]:>12}" for n in names))
print(f"{'seconds':10}" + "".join(f"{secs[n]:>12}" for n in names))

order = []
for n in names:
    if runs[n]:
        order += [k for k in runs[n]["order"] if k not in order]
with open(os.path.join(results, "tests.tsv"), "w") as f:
    f.write("test\tours\tlio\ttgt\n")
    for k in order:
        f.write(k + "\t" + "\t".join((runs[n] or {"outcome": {}})["outcome"].get(k, "-") for n in names) + "\n")

def outcome(n, k):
    return (runs[n] or {"outcome": {}})["outcome"].get(k, "-")
for n in names:
    failed = [k for k in order if outcome(n, k) == "FAILED"]
    print(f"\nFAILED on {n} ({len(failed)}):" + ("" if failed else " none"))
    for k in failed:
        print(f"  {k}" + "".join(f"  {m}:{outcome(m, k)}" for m in names if m != n))
for other in ("lio", "tgt"):
    a = [k for k in order if outcome(other, k) == "FAILED" and outcome("ours", k) == "passed"]
    b = [k for k in order if outcome("ours", k) == "FAILED" and outcome(other, k) == "passed"]
    s = [k for k in order if outcome(other, k) == "skipped" and outcome("ours", k) == "passed"]
    t = [k for k in order if outcome("ours", k) == "skipped" and outcome(other, k) == "passed"]
    print(f"\nours vs {other}: {len(a)} fail on {other} and pass on ours, {len(b)} fail on ours and pass on {other};"
          f" {len(s)} skip on {other} but run fully on ours, {len(t)} skip on ours but run fully on {other}")
    for label, ks in ((f"skip on {other}, full on ours", s), (f"skip on ours, full on {other}", t)):
        for k in ks:
            print(f"  {label}: {k}")
PY
cat "$results/summary.txt"
echo "logs and tests.tsv: $results"

s=$(grep -E '^\s+tests\s' "$results/cu-ours.log" 2>/dev/null | tail -1 || true)
[ -n "$s" ] || vm_fail "the suite against our target did not reach its summary (see $results/cu-ours.log)"
read -r _ _ _ _ ours_failed _ <<<"$s"
for n in lio tgt; do
    grep -qE '^\s+tests\s' "$results/cu-$n.log" 2>/dev/null || vm_fail "the suite against $n did not reach its summary (see $results/cu-$n.log)"
done
target_alive ours || vm_fail "our target died during the suite"
((ours_failed == 0)) || vm_fail "$ours_failed test(s) failed against our target"
((rc == 0)) || vm_fail "the guest script failed (exit $rc)"
vm_log "ok"
