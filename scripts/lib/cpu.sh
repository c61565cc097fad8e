# shellcheck shell=bash
# CPU time of a benchmark's two sides, for the bench scripts (source it; bash). Throughput on a
# 2-core machine is often bound by the client, so a ratio of MiB/s alone can hide which side is
# cheaper: these give each side's CPU seconds over one run, to divide by its I/Os or bytes.

# measure_run PID OUT CMD...: runs CMD with its stdout in OUT and its stderr in OUT.err, and prints
# "server_s client_s wall_s": the CPU seconds process PID (the server side: a target, iperf3 -s)
# spent while CMD ran (utime + stime of all its threads, /proc/PID/stat, as scripts/bench-iser
# reads it), CMD's own CPU seconds (its rusage, with the children it waited for: a `timeout` in
# front still counts the client behind it), and the wall-clock seconds. Exits with CMD's status.
measure_run() {
    python3 - "$@" <<'PY'
import os, resource, subprocess, sys, time

pid, out, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
hz = os.sysconf("SC_CLK_TCK")


def ticks():
    # Fields after the ")" that ends the command name (which may hold spaces): utime is the
    # 14th field of the line, stime the 15th.
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


before = ticks()
start = time.monotonic()
with open(out, "w") as stdout, open(out + ".err", "w") as stderr:
    status = subprocess.run(cmd, stdout=stdout, stderr=stderr).returncode
wall = time.monotonic() - start
after = ticks()
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
if status != 0:
    sys.stderr.write(f"measure_run: {cmd[0]} exited with {status}; stderr in {out}.err\n")
    sys.exit(status)
print((after - before) / hz, usage.ru_utime + usage.ru_stime, wall)
PY
}

# cpu_seconds PID: the CPU seconds process PID has used so far (utime + stime of all its threads,
# /proc/PID/stat, as measure_run reads them): for a third process beside measure_run's two (the
# ceph-osd behind an RBD LUN), read before and after.
cpu_seconds() {
    awk -v hz="$(getconf CLK_TCK)" '{sub(/^.*\) /, ""); print ($12 + $13) / hz}' "/proc/$1/stat"
}

# median: the median of the numbers on stdin, one a line.
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
