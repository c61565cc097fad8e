#!/usr/bin/env bash
# open-iscsi's negotiation matrix against `iscsi target`: ImmediateData x InitialR2T x
# MaxRecvDataSegmentLength x burst lengths offered by the kernel initiator, against a target that
# offers the most (the defaults) and one that offers less; each cell's negotiated values are checked
# against RFC 7143's result functions and data is verified under them. Guest side:
# guest/open-iscsi-negotiation.sh (which computes the expected values).
set -euo pipefail
# shellcheck source=tests/linux-vm/lib.sh
source "$(dirname "$0")/../lib.sh"
vm_setup
base=iqn.2026-11.rs.iscsi.test
p1=$(vm_free_port)
p2=$(vm_free_port)
[ "$p1" != "$p2" ] || p2=$((p1 + 1))

# Target 1: the target's default offers (ImmediateData=Yes, InitialR2T=No, MRDSL 256 KiB,
# FirstBurstLength 256 KiB, MaxBurstLength 1 MiB), written out so the guest knows them.
cat >t1.toml <<TOML
listen = ["127.0.0.1:$p1"]
[negotiation]
immediate_data = true
initial_r2t = false
max_recv_data_segment_length = 262144
first_burst_length = 262144
max_burst_length = 1048576
[[target]]
name = "$base:matrix"
luns = ["ram:64M"]
TOML
# Target 2: offers less (InitialR2T=Yes, small segments and bursts), so the target's side of the
# Minimum/OR rules decides.
cat >t2.toml <<TOML
listen = ["127.0.0.1:$p2"]
[negotiation]
immediate_data = true
initial_r2t = true
max_recv_data_segment_length = 16384
first_burst_length = 32768
max_burst_length = 131072
max_outstanding_r2t = 1
[[target]]
name = "$base:small"
luns = ["ram:64M"]
TOML
target_start t1 "$p1" --config t1.toml
target_start t2 "$p2" --config t2.toml

# The cells: ImmediateData:InitialR2T:MaxRecvDataSegmentLength:FirstBurstLength:MaxBurstLength.
cells1=""
for imm in Yes No; do
    for r2t in Yes No; do
        for mrdsl in 8192 262144; do
            for burst in 8192:16384 262144:1048576; do
                cells1+=" $imm:$r2t:$mrdsl:$burst"
            done
        done
    done
done
cells2="Yes:No:262144:262144:1048576 No:No:8192:8192:16384 Yes:Yes:65536:16384:65536"
cat >params.sh <<PARAMS
TARGETS="$base:matrix $p1
$base:small $p2"
T1_IMMEDIATE=Yes T1_INITIAL_R2T=No T1_MRDSL=262144 T1_FBL=262144 T1_MBL=1048576
T2_IMMEDIATE=Yes T2_INITIAL_R2T=Yes T2_MRDSL=16384 T2_FBL=32768 T2_MBL=131072
CELLS_1="$cells1"
CELLS_2="$cells2"
PARAMS
guest=$LINUX_VM_DIR/guest
rc=0
vm_run --to-host "$p1" --to-host "$p2" --timeout 900 "$guest/open-iscsi-negotiation.sh" \
    "$guest/open-iscsi-lib.sh" params.sh || rc=$?
grep -E '^(ok|not ok) - ' console.log || true
target_alive t1 || vm_fail "target 1 died"
target_alive t2 || vm_fail "target 2 died"
[ "$rc" = 0 ] || vm_fail "guest script exit $rc"
grep -q '^NEGOTIATION OK' console.log || vm_fail "the guest did not finish"
vm_log "pass: $(grep '^NEGOTIATION OK' console.log)"
