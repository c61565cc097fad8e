#!/usr/bin/env bash
# Records the iSCSI fixture captures in this directory: real traffic between libiscsi (initiator)
# and tgt (target) on 127.0.0.1, captured with tshark, then split into per-direction byte streams
# and a JSON manifest per scenario (see README.md and analyze.py).
#
#   bash testdata/captures/record.sh [--with-vm]
#
# Needs root and: apt-get install -y tgt libiscsi-bin tshark python3
# --with-vm also records "datadigest-openiscsi": the Linux kernel initiator (open-iscsi) in the
# shared test VM (../shared/linux-vm, several minutes) with HeaderDigest and DataDigest CRC32C,
# the one available initiator that can do DataDigest.  Without it, existing files of that
# scenario are left as they are.
# Environment: PORT (default 3300, use 3299-3309), CTL (tgtd control index, default 73).
# Traffic stays on 127.0.0.1; tgtd and tshark are stopped by PID on exit.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PORT=${PORT:-3300}
CTL=${CTL:-73}
IQN=iqn.2026-11.test:capture
WITH_VM=0
[ "${1:-}" = "--with-vm" ] && WITH_VM=1
VM_DIR=${VM_DIR:-$HERE/../../../shared/linux-vm}

for tool in tgtd tgtadm tshark iscsi-ls iscsi-inq iscsi-readcapacity16 python3; do
  command -v "$tool" >/dev/null || { echo "record.sh: $tool missing (apt-get install -y tgt libiscsi-bin tshark python3)" >&2; exit 1; }
done
if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
  echo "record.sh: something already listens on 127.0.0.1:$PORT; set PORT=" >&2; exit 1
fi

WORK=$(mktemp -d /tmp/iscsi-capture.XXXXXX)
LUN=/dev/shm/iscsi-rs-capture-$PORT.img
TGTD_PID=""
TSHARK_PID=""
cleanup() {
  if [ -n "$TSHARK_PID" ]; then kill -INT "$TSHARK_PID" 2>/dev/null || true; wait "$TSHARK_PID" 2>/dev/null || true; fi
  if [ -n "$TGTD_PID" ]; then kill -KILL "$TGTD_PID" 2>/dev/null || true; wait "$TGTD_PID" 2>/dev/null || true; fi
  rm -f "$LUN"
  rm -rf "$WORK"
}
trap cleanup EXIT

tgt() { tgtadm -C "$CTL" --lld iscsi "$@"; }
# tgt's per-target digest setting: what it answers to the initiator's offer.
target_digests() {
  tgt --op update --mode target --tid 1 --name HeaderDigest --value "$1"
  tgt --op update --mode target --tid 1 --name DataDigest --value "$2"
}

capture_start() {
  tshark -i lo -f "tcp port $PORT" -w "$WORK/$1.pcapng" -q >"$WORK/tshark-$1.log" 2>&1 &
  TSHARK_PID=$!
  for _ in $(seq 100); do grep -q "Capturing on" "$WORK/tshark-$1.log" && break; sleep 0.1; done
  grep -q "Capturing on" "$WORK/tshark-$1.log" || { cat "$WORK/tshark-$1.log" >&2; exit 1; }
  sleep 0.5
}
capture_stop() {
  sleep 0.5
  kill -INT "$TSHARK_PID"; wait "$TSHARK_PID" || true
  TSHARK_PID=""
}

# --- target: tgtd with one 64 MiB file LUN (LUN 0 is tgt's controller LUN) ---
rm -f "$LUN"; truncate -s 64M "$LUN"
tgtd -f --iscsi portal=127.0.0.1:$PORT -C "$CTL" >"$WORK/tgtd.log" 2>&1 &
TGTD_PID=$!
for _ in $(seq 100); do tgtadm -C "$CTL" --op show --mode sys >/dev/null 2>&1 && break; sleep 0.1; done
tgt --op new --mode target --tid 1 -T "$IQN"
tgt --op new --mode logicalunit --tid 1 --lun 1 -b "$LUN"
tgt --op bind --mode target --tid 1 -I ALL
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done

URL=iscsi://127.0.0.1:$PORT/$IQN/1
declare -A DESC CMDS
run() { # scenario description command...
  local name=$1 desc=$2; shift 2
  echo "== $name: $*"
  "$@" >"$WORK/$name.out" 2>&1 || { cat "$WORK/$name.out" >&2; exit 1; }
  DESC[$name]=$desc
  local cmd="$*"; CMDS[$name]+="${cmd//$HERE/testdata/captures}"$'\n'
}

# a. discovery: SendTargets discovery session, then a normal session listing the LUNs.
target_digests None None
capture_start discovery
run discovery "iscsi-ls -s: SendTargets discovery session, then a normal session (REPORT LUNS, INQUIRY per LUN, READ CAPACITY(10))" \
  iscsi-ls -s "iscsi://127.0.0.1:$PORT"
capture_stop

# b. inquiry-nodigest: two normal sessions; libiscsi offers HeaderDigest=None,CRC32C, tgt picks None.
capture_start inquiry-nodigest
run inquiry-nodigest "iscsi-inq then iscsi-readcapacity16 on LUN 1 (two sessions), no digests" iscsi-inq "$URL"
run inquiry-nodigest "iscsi-inq then iscsi-readcapacity16 on LUN 1 (two sessions), no digests" iscsi-readcapacity16 "$URL"
capture_stop

# c. inquiry-headerdigest: the libiscsi tools always offer HeaderDigest=None,CRC32C (they call
# iscsi_set_header_digest(NONE_CRC32C) after parsing the URL), so the target is set to CRC32C.
target_digests CRC32C None
capture_start inquiry-headerdigest
run inquiry-headerdigest "iscsi-inq then iscsi-readcapacity16 on LUN 1 (two sessions); tgt set to HeaderDigest=CRC32C, so CRC32C is negotiated" iscsi-inq "$URL"
run inquiry-headerdigest "iscsi-inq then iscsi-readcapacity16 on LUN 1 (two sessions); tgt set to HeaderDigest=CRC32C, so CRC32C is negotiated" iscsi-readcapacity16 "$URL"
capture_stop

# d. datadigest-libiscsi: tgt set to DataDigest=CRC32C; libiscsi only ever offers DataDigest=None
# (hard-coded in lib/login.c) and tgt answers None: no data digest results.
target_digests None CRC32C
capture_start datadigest-libiscsi
run datadigest-libiscsi "iscsi-inq on LUN 1 with tgt set to DataDigest=CRC32C: libiscsi offers only DataDigest=None, tgt answers None (no data digest)" iscsi-inq "$URL"
capture_stop

# e. readwrite: WRITE10 4 KiB (immediate data), WRITE10 24 KiB (immediate data + R2T + 2 Data-Out),
# READ10 28 KiB (one Data-In with status), through libiscsi's API (rw_driver.py).
target_digests None None
capture_start readwrite-nodigest
run readwrite-nodigest "rw_driver.py (libiscsi via ctypes): WRITE10 8 blocks, WRITE10 48 blocks (R2T + Data-Out), READ10 56 blocks; initiator offers HeaderDigest=None" \
  python3 "$HERE/rw_driver.py" "127.0.0.1:$PORT" "$IQN" 1 none
capture_stop

target_digests CRC32C None
capture_start readwrite-headerdigest
run readwrite-headerdigest "rw_driver.py (libiscsi via ctypes): same I/O as readwrite-nodigest; initiator offers only HeaderDigest=CRC32C, tgt set to CRC32C" \
  python3 "$HERE/rw_driver.py" "127.0.0.1:$PORT" "$IQN" 1 crc32c
capture_stop

# f. (--with-vm) datadigest-openiscsi: the Linux kernel initiator in the test VM, both digests.
if [ "$WITH_VM" = 1 ]; then
  target_digests CRC32C CRC32C
  capture_start datadigest-openiscsi
  echo "$PORT" >"$WORK/port"
  echo "== datadigest-openiscsi: $VM_DIR/run --to-host $PORT openiscsi-guest.sh (boots a VM, minutes)"
  (cd "$WORK" && "$VM_DIR/run" --to-host "$PORT" --timeout 600 "$HERE/openiscsi-guest.sh" "$WORK/port" >"$WORK/vm.log" 2>&1) \
    || { tail -40 "$WORK/vm.log" >&2; exit 1; }
  DESC[datadigest-openiscsi]="open-iscsi (Linux 6.1 iscsi_tcp) in the test VM: login with HeaderDigest=CRC32C and DataDigest=CRC32C, kernel LUN scan, 4 KiB + 24 KiB O_DIRECT writes, 28 KiB O_DIRECT read, logout (host side of qemu's forward: socat)"
  CMDS[datadigest-openiscsi]="../shared/linux-vm/run --to-host $PORT testdata/captures/openiscsi-guest.sh"$'\n'
  capture_stop
fi

kill -KILL "$TGTD_PID"; wait "$TGTD_PID" 2>/dev/null || true; TGTD_PID=""

# --- fixtures ---
echo "== writing fixtures to $HERE"
for name in "${!DESC[@]}"; do
  rm -f "$HERE/$name".conn*.bin "$HERE/$name.json" "$HERE/$name.pcapng"
done
for name in $(printf '%s\n' "${!DESC[@]}" | sort); do
  cp "$WORK/$name.pcapng" "$HERE/$name.pcapng"
  mapfile -t cmds < <(printf '%s' "${CMDS[$name]}")
  python3 "$HERE/analyze.py" "$PORT" "$name" "$HERE/$name.pcapng" "$HERE" "${DESC[$name]}" "${cmds[@]}"
done
du -ch "$HERE"/*.pcapng "$HERE"/*.bin "$HERE"/*.json | tail -1
