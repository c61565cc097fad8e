#!/bin/sh
# Guest side of jobs/conformance.sh. Two ways:
# - ./serve-lio present: configure LIO (./lio-target.py: a 256 MiB file LUN with thin provisioning,
#   CAW, XCOPY and PR emulation) on 0.0.0.0:3260, write out/lio-ready, and keep serving until the
#   host writes ./done (libiscsi's suite then runs on the host, through --from-host).
# - else: run libiscsi's conformance suite (iscsi-test-cu -d --test=ALL URL URL, the second URL for
#   the multipath tests) here against each target in ./targets.txt, one "NAME URL" per line; NAME
#   "lio" first configures LIO here. Full output in out/cu-NAME.log, wall time in out/cu-NAME.seconds.
# The iscsi-test-cu version is written to out/libiscsi-bin.version either way.
# Exit status: 0 when LIO served / every suite ran to its summary (failed tests are the host's to judge).
set -u
mkdir -p out
dpkg-query -W -f '${Version}\n' libiscsi-bin > out/libiscsi-bin.version
if [ -e serve-lio ]; then
    python3 ./lio-target.py > out/lio-setup.log 2>&1 || { cat out/lio-setup.log; exit 1; }
    cat out/lio-setup.log
    touch out/lio-ready
    i=0
    while [ ! -e ./done ] && [ $i -lt 3000 ]; do sleep 0.5; i=$((i + 1)); done
    [ -e ./done ] || { echo "conformance: the host never wrote ./done"; exit 1; }
    exit 0
fi
status=0
while read -r name url; do
    [ -n "$name" ] || continue
    if [ "$name" = lio ]; then
        python3 ./lio-target.py > out/lio-setup.log 2>&1 || { cat out/lio-setup.log; exit 1; }
        cat out/lio-setup.log
    fi
    echo "conformance: $name: $url"
    start=$(date +%s)
    timeout 1500 iscsi-test-cu -d --test=ALL "$url" "$url" > "out/cu-$name.log" 2>&1
    echo $(( $(date +%s) - start )) > "out/cu-$name.seconds"
    grep -A4 "Run Summary" "out/cu-$name.log" || { echo "conformance: $name: no summary"; status=1; }
    echo "conformance: $name: $(cat "out/cu-$name.seconds") s, $(grep -c '\[SKIPPED\]' "out/cu-$name.log") [SKIPPED] lines"
done < targets.txt
exit $status
