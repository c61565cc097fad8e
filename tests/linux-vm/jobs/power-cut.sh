#!/usr/bin/env bash
# Crash consistency through a power cut (issue 18, item 5): `iscsi target` runs in the VM on the VM's
# own disks (files on ext4, a buffered block device, an O_DIRECT block device: guest/power-cut.sh),
# our initiator on the host writes to every LUN with `iscsi verify --journal`, and the VM is killed
# (qemu, SIGKILL) in the middle: the guest's page cache, its kernel and the target vanish together,
# which a SIGKILL of the target alone (crates/cli/tests/crash.rs) cannot show. The VM boots again on
# the same disks and `iscsi verify --check` reads every LUN back against its journal.
# Must hold: every write acknowledged with FUA, or acknowledged before a SYNCHRONIZE CACHE that
# completed, is there (SBC-4 5.40, 5.30), on each store kind; no block holds what no write put
# there. And the cut must be real: on the LUN whose writes were never made durable, acknowledged
# writes are gone (they lived in the guest's page cache), or the test would prove nothing.
set -euo pipefail
# shellcheck source=tests/linux-vm/lib.sh
source "$(dirname "$0")/../lib.sh"
vm_setup
iqn=iqn.2026-11.rs.iscsi.test:power-cut
# 256 slots of 16 KiB per LUN: each slot rewritten several times within the load.
region=4M bs=16k slots=256
# LUN number, durability of its load, what it is.
luns=("0 fua file" "1 sync file" "2 none file" "3 fua block" "4 sync block,direct")
cp "$ISCSI_BIN" ./iscsi
for disk in fs block direct; do truncate -s 64M "$disk.img"; done
disks=(--disk fs.img --disk block.img --disk direct.img)
guest=$LINUX_VM_DIR/guest

# boot MODE PORT: starts the VM in MODE (see the guest script) with the guest's 3260 on PORT and
# waits until its target is up.
boot() {
    echo "MODE=$1 IQN=$iqn" >params.sh
    vm_run_bg --from-host "$2:3260" "${disks[@]}" --timeout 900 "$guest/power-cut.sh" params.sh ./iscsi
    vm_wait_file "$VM_SHARE/out/ready" 300 "$VM_RUN_PID" || {
        wait "$VM_RUN_PID" || true
        vm_fail "the guest's target did not come up ($1)"
    }
}
# lines FILE PREFIX: how many lines of FILE start with PREFIX (0 before FILE exists).
lines() {
    local n
    n=$(grep -c "^$2" "$1" 2>/dev/null) || true
    echo "${n:-0}"
}

port=$(vm_free_port)
boot load "$port"
vm_log "boot 1: the target in the VM is up; writing to ${#luns[@]} LUNs"
pids=()
for entry in "${luns[@]}"; do
    read -r lun durability _ <<<"$entry"
    "$ISCSI_BIN" verify "iscsi://127.0.0.1:$port/$iqn/$lun" --rw write --bs "$bs" --region "$region" \
        --qd 16 --time 900 --durability "$durability" --sync-interval 200 --journal "journal-$lun" \
        --initiator-name "iqn.2026-11.rs.iscsi.test:writer-$lun" >"load-$lun.log" 2>&1 &
    pids+=($!)
done
# Cut once every LUN's region has been filled and rewritten with writes of its kind under way: FUA
# writes acknowledged ("U"), or acknowledged writes ("A") with flushes done ("D") after them.
ready_to_cut() {
    local entry lun durability
    for entry in "${luns[@]}"; do
        read -r lun durability _ <<<"$entry"
        case $durability in
            fua) (($(lines "journal-$lun" "U ") >= 2 * slots)) || return 1 ;;
            sync) (($(lines "journal-$lun" "A ") >= 2 * slots && $(lines "journal-$lun" "D ") >= 3)) || return 1 ;;
            none) (($(lines "journal-$lun" "A ") >= 2 * slots)) || return 1 ;;
        esac
    done
}
for i in $(seq 1 1200); do
    ready_to_cut && break
    kill -0 "$VM_RUN_PID" 2>/dev/null || vm_fail "the VM ended during the load"
    ((i < 1200)) || vm_fail "the loads did not get far enough in 240 s: $(for e in "${luns[@]}"; do set -- $e; echo -n "LUN $1 $(lines "journal-$1" "A ")A/$(lines "journal-$1" "U ")U/$(lines "journal-$1" "D ")D "; done)"
    sleep 0.2
done
qemu=$(vm_power_cut) || vm_fail "no qemu process of this VM to kill"
vm_log "power cut: qemu (PID $qemu) killed with every load writing"
wait "$VM_RUN_PID" 2>/dev/null || true
sleep 1
for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
for entry in "${luns[@]}"; do
    set -- $entry
    vm_log "LUN $1 ($3, $2): journal at the cut: $(lines "journal-$1" "W ") issued, $(lines "journal-$1" "A ") acknowledged, $(lines "journal-$1" "U ") FUA acknowledged, $(lines "journal-$1" "D ") flushes"
done

port=$(vm_free_port)
boot check "$port"
vm_log "boot 2: the target is up again on the same disks; checking every LUN against its journal"
failed=0
for entry in "${luns[@]}"; do
    read -r lun durability kind <<<"$entry"
    rc=0
    "$ISCSI_BIN" verify "iscsi://127.0.0.1:$port/$iqn/$lun" --check "journal-$lun" --json \
        >"check-$lun.json" 2>"check-$lun.err" || rc=$?
    verdict=$(DURABILITY=$durability SLOTS=$slots RC=$rc python3 -c 'import json, os, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("bad no report (%s)" % e); sys.exit()
slots = int(os.environ["SLOTS"]); durability = os.environ["DURABILITY"]
lost_acked = slots - r["acknowledged_slots"]
ok = os.environ["RC"] == "0" and r["slots"] == slots and r["lost_blocks"] == 0 and r["wrong_blocks"] == 0 and r["failed_reads"] == 0
if durability == "none":
    # The control: nothing durable to keep, and the cut must have lost acknowledged writes. A slot
    # may also miss its newest acknowledged write by holding a newer one that was in flight: at
    # most QD (16) slots, so more than that were lost.
    ok = ok and lost_acked > 16
else:
    ok = ok and r["durable_slots"] == slots
print(("ok" if ok else "bad") + " %d of %d slots held a durable write, %d blocks lost, %d wrong, %d slots torn, %d slots without their newest acknowledged write (not durable, or a newer one in flight)" % (
    r["durable_slots"], slots, r["lost_blocks"], r["wrong_blocks"], r["torn_slots"], lost_acked))' "check-$lun.json")
    if [ "${verdict%% *}" = ok ]; then
        echo "PASS LUN $lun ($kind, $durability): ${verdict#* }"
    else
        echo "FAIL LUN $lun ($kind, $durability): ${verdict#* }; $(tail -3 "check-$lun.err" | tr '\n' ' ')"
        failed=1
    fi
done
touch "$VM_SHARE/checked"
rc=0
wait "$VM_RUN_PID" || rc=$?
rm -f ./iscsi ./*.img
[ "$rc" = 0 ] || vm_fail "guest script exit $rc (second boot)"
((failed == 0)) || vm_fail "a LUN did not hold what its journal requires"
vm_log "pass"
