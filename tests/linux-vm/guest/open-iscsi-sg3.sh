# shellcheck shell=dash
# Guest side of jobs/open-iscsi-sg3.sh: sg3-utils through the Linux kernel initiator against
# `iscsi target`'s disk (a thin RAM LUN): INQUIRY and its VPD pages, READ CAPACITY(16), persistent
# reservations, UNMAP, WRITE SAME, COMPARE AND WRITE (match and miscompare), SYNCHRONIZE CACHE and
# LUN/target resets. Every step is checked for the right data or the right sense, not just exit 0.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
# shellcheck source=open-iscsi-lib.sh
. ./open-iscsi-lib.sh
# shellcheck disable=SC1091 # written by the host job
. ./params.sh # PORT, IQN, SIZE_BYTES (the LUN's size)
P=10.0.2.100:$PORT
start_iscsid
node_new "$IQN" "$P"
check "login" login "$IQN" "$P"
dev=$(disk "$IQN" 0)
sg=$(sg_of "$dev") || fail "no sg device for $dev"
note "disk $dev, $sg"

# Checks below go on after a failure (so one boot shows every mismatch); the script fails at the end.
failed=0
# nok WHAT: a failed check that does not stop the script.
nok() { echo "not ok - $*"; failed=1; }
# expect FILE PATTERN WHAT: the saved output FILE must match the extended regex PATTERN.
expect() {
    if grep -Eq -- "$2" "$1"; then ok "$3"; else cat "$1"; nok "$3: no match for /$2/"; fi
}
# run_to FILE COMMAND...: runs COMMAND with its output in out/FILE; a non-zero exit is a failure.
run_to() {
    local f=out/$1 rc=0
    shift
    "$@" >"$f" 2>&1 || rc=$?
    [ "$rc" = 0 ] || { cat "$f"; nok "$* exited $rc"; }
}
# read_blocks LBA COUNT FILE: reads COUNT 512-byte blocks at LBA straight from the disk (O_DIRECT).
# (Large dd blocks with byte offsets: one SCSI command per MiB, not per 512 bytes.)
read_blocks() {
    dd if="$dev" of="$3" bs=1M skip=$(($1 * 512)) count=$(($2 * 512)) \
        iflag=direct,skip_bytes,count_bytes status=none
}
# write_blocks FILE LBA: writes FILE at LBA (O_DIRECT).
write_blocks() {
    dd if="$1" of="$dev" bs=1M seek=$(($2 * 512)) oflag=direct,seek_bytes conv=notrunc status=none
}

# --- INQUIRY: standard data (a disk, SPC-4), then the VPD pages the target lists.
run_to inq.txt sg_inq "$dev"
expect out/inq.txt 'PQual=0 +PDT=0' "sg_inq: peripheral qualifier 0, device type 0 (disk)"
expect out/inq.txt '[Vv]ersion=0x06 +\[SPC-4\]' "sg_inq: version SPC-4"
expect out/inq.txt 'Vendor identification: ISCSI-RS' "sg_inq: vendor ISCSI-RS"
run_to vpd00.txt sg_vpd --page=0x00 "$dev"
for page in 'Unit serial number' 'Device identification' 'Block limits' 'Block device characteristics' 'Logical block provisioning'; do
    expect out/vpd00.txt "$page" "VPD 0x00 lists: $page"
done
run_to vpd80.txt sg_vpd --page=0x80 "$dev"
serial=$(awk -F': ' '/Unit serial number:/ {print $2}' out/vpd80.txt)
[ "${#serial}" = 16 ] || { cat out/vpd80.txt; fail "VPD 0x80: serial '$serial'"; }
ok "VPD 0x80: unit serial number $serial"
run_to vpd83.txt sg_vpd --page=0x83 "$dev"
expect out/vpd83.txt 'designator type: NAA' "VPD 0x83: an NAA designator for the LU"
expect out/vpd83.txt "^ +0x6[0-9a-f]{31}\$" "VPD 0x83: the NAA designator is type 6 (IEEE Registered Extended, 16 bytes)"
expect out/vpd83.txt "$IQN" "VPD 0x83: the target's SCSI name string"
expect out/vpd83.txt "$IQN,t,0x0*1" "VPD 0x83: the target port's SCSI name string"
expect out/vpd83.txt 'Relative target port' "VPD 0x83: a relative target port designator"
run_to vpdb0.txt sg_vpd --page=0xb0 "$dev"
expect out/vpdb0.txt 'Maximum compare and write length: [1-9][0-9]* blocks' "VPD 0xb0: COMPARE AND WRITE length > 0"
expect out/vpdb0.txt 'Maximum unmap LBA count: [1-9]' "VPD 0xb0: UNMAP LBA count > 0 (thin)"
expect out/vpdb0.txt 'Maximum write same length: 0x[1-9a-f]' "VPD 0xb0: WRITE SAME length > 0"
run_to vpdb1.txt sg_vpd --page=0xb1 "$dev"
expect out/vpdb1.txt 'Non-rotating medium' "VPD 0xb1: non-rotating medium"
run_to vpdb2.txt sg_vpd --page=0xb2 "$dev"
expect out/vpdb2.txt 'Unmap command supported \(LBPU\): 1' "VPD 0xb2: LBPU=1"
expect out/vpdb2.txt 'Write same \(16\) with unmap bit supported \(LBPWS\): 1' "VPD 0xb2: LBPWS=1"
expect out/vpdb2.txt 'Provisioning type: 2' "VPD 0xb2: thin provisioned"
# A page the target does not have: ILLEGAL REQUEST, INVALID FIELD IN CDB.
# (sg_raw, since sg_vpd checks page 0x00 itself and never asks.)
sg_raw -v -r 255 "$dev" 12 01 89 00 ff 00 >out/vpd89.txt 2>&1 || true
expect out/vpd89.txt 'Illegal Request' "VPD 0x89 (not offered): sense key ILLEGAL REQUEST"
expect out/vpd89.txt '[Ii]nvalid field in cdb' "VPD 0x89 (not offered): INVALID FIELD IN CDB"

# --- READ CAPACITY(16): the size the host configured, 512-byte blocks, thin and zeroing.
run_to readcap.txt sg_readcap --long "$dev"
blocks=$((SIZE_BYTES / 512))
expect out/readcap.txt "Last LBA=$((blocks - 1)) \(0x[0-9a-f]+\), Number of logical blocks=$blocks" "READ CAPACITY(16): $blocks blocks"
expect out/readcap.txt 'Logical block length=512 bytes' "READ CAPACITY(16): 512-byte blocks"
expect out/readcap.txt 'Logical block provisioning: lbpme=1, lbprz=1' "READ CAPACITY(16): LBPME=1 LBPRZ=1"

# --- Persistent reservations: register, reserve, read keys and reservation, release, unregister.
key=0x1234abcd
run_to pr-reg.txt sg_persist --out --register --param-sark=$key "$dev"
run_to pr-keys.txt sg_persist --in --read-keys "$dev"
expect out/pr-keys.txt "1 registered reservation key" "PR: one key registered"
expect out/pr-keys.txt "$key" "PR: READ KEYS shows $key"
run_to pr-res.txt sg_persist --out --reserve --param-rk=$key --prout-type=1 "$dev"
run_to pr-read.txt sg_persist --in --read-reservation "$dev"
expect out/pr-read.txt "Key=$key" "PR: READ RESERVATION shows the holder's key"
expect out/pr-read.txt 'type: Write Exclusive' "PR: type Write Exclusive"
# Reserving with a key that is not registered: RESERVATION CONFLICT (sg3-utils exit 24).
rc=0; sg_persist --out --reserve --param-rk=0x99 --prout-type=1 "$dev" >out/pr-conflict.txt 2>&1 || rc=$?
[ "$rc" = 24 ] || { cat out/pr-conflict.txt; fail "PR: reserve with an unregistered key: exit $rc, expected 24"; }
ok "PR: reserving with an unregistered key is a RESERVATION CONFLICT"
run_to pr-rel.txt sg_persist --out --release --param-rk=$key --prout-type=1 "$dev"
run_to pr-read2.txt sg_persist --in --read-reservation "$dev"
expect out/pr-read2.txt 'there is NO reservation held' "PR: released"
run_to pr-unreg.txt sg_persist --out --register --param-rk=$key --param-sark=0 "$dev"
run_to pr-keys2.txt sg_persist --in --read-keys "$dev"
expect out/pr-keys2.txt 'there are NO registered reservation keys' "PR: unregistered"

# --- UNMAP on the thin RAM LUN: written blocks read back as zeros afterwards (LBPRZ).
head -c 1048576 /dev/urandom >out/random-1m
write_blocks out/random-1m 4096
read_blocks 4096 2048 out/back-1m
cmp -s out/random-1m out/back-1m || fail "the 1 MiB written at LBA 4096 does not read back"
run_to unmap.txt sg_unmap --lba=4096 --num=2048 "$dev"
read_blocks 4096 2048 out/unmapped
head -c 1048576 /dev/zero >out/zero-1m
cmp -s out/zero-1m out/unmapped || fail "unmapped blocks do not read back as zeros"
ok "UNMAP: 2048 written blocks read back as zeros"

# --- WRITE SAME(16): one block's pattern repeated over 64 blocks; then with UNMAP: zeros.
head -c 512 /dev/urandom >out/block
run_to ws.txt sg_write_same --16 --in=out/block --lba=8192 --num=64 "$dev"
for _ in $(seq 64); do cat out/block; done >out/ws-expected
read_blocks 8192 64 out/ws-back
cmp -s out/ws-expected out/ws-back || fail "WRITE SAME: 64 blocks are not the pattern"
read_blocks 8256 1 out/ws-after
cmp -s out/ws-after <(head -c 512 /dev/zero) || fail "WRITE SAME wrote past its 64 blocks"
ok "WRITE SAME(16): the pattern on exactly 64 blocks"
run_to ws-unmap.txt sg_write_same --16 --unmap --in=out/block --lba=8192 --num=64 "$dev"
read_blocks 8192 64 out/ws-unmapped
cmp -s out/ws-unmapped <(head -c 32768 /dev/zero) || fail "WRITE SAME with UNMAP: blocks not zero"
ok "WRITE SAME(16) with UNMAP: the blocks read back as zeros"

# --- COMPARE AND WRITE: a match writes the new block; a miscompare writes nothing and returns
# MISCOMPARE sense with the offset of the first differing byte in INFORMATION.
head -c 512 /dev/urandom >out/a
head -c 512 /dev/urandom >out/b
head -c 512 /dev/urandom >out/c
write_blocks out/a 10000
cat out/a out/b >out/caw-match
run_to caw.txt sg_compare_and_write --in=out/caw-match --lba=10000 --num=1 "$dev"
read_blocks 10000 1 out/caw-back
cmp -s out/b out/caw-back || fail "COMPARE AND WRITE (match): the block is not the new data"
ok "COMPARE AND WRITE: a match writes the new block"
# Compare data = b with byte 100 changed, so the first difference is at offset 100.
cp out/b out/b-changed
printf '\x5a' | dd of=out/b-changed bs=1 seek=100 conv=notrunc status=none
[ "$(od -An -tx1 -j100 -N1 out/b | tr -d ' ')" != 5a ] || printf '\xa5' | dd of=out/b-changed bs=1 seek=100 conv=notrunc status=none
cat out/b-changed out/c >out/caw-miss
rc=0; sg_compare_and_write -v --in=out/caw-miss --lba=10000 --num=1 "$dev" >out/caw-miss.txt 2>&1 || rc=$?
[ "$rc" = 14 ] || { cat out/caw-miss.txt; fail "COMPARE AND WRITE (miscompare): exit $rc, expected 14 (miscompare)"; }
expect out/caw-miss.txt '[Mm]iscompare during verify operation' "COMPARE AND WRITE (miscompare): sense MISCOMPARE / MISCOMPARE DURING VERIFY OPERATION"
expect out/caw-miss.txt '[Ii]nfo(rmation)?[^0-9]*(0x0*64|100)\b' "COMPARE AND WRITE (miscompare): INFORMATION = offset 100 of the first difference"
read_blocks 10000 1 out/caw-back2
cmp -s out/b out/caw-back2 || fail "COMPARE AND WRITE (miscompare) changed the block"
ok "COMPARE AND WRITE: a miscompare leaves the block alone"

# --- SYNCHRONIZE CACHE(10) and (16), whole disk and a range.
run_to sync.txt sg_sync "$dev"
run_to sync16.txt sg_sync --16 --lba=4096 --count=2048 "$dev"
ok "SYNCHRONIZE CACHE (10 and 16) succeed"

# --- Resets: LUN reset and target reset through the SCSI error handler (iSCSI task management).
# Persistent reservations survive both (SPC-4 5.13.2); the disk keeps working and keeps its data.
run_to pr-reg2.txt sg_persist --out --register --param-sark=$key "$dev"
run_to reset-dev.txt sg_reset --device "$dev"
run_to reset-target.txt sg_reset --target "$dev"
sleep 2
dmesg >out/dmesg-reset.txt
grep -Eiq 'reset.*(fail|error)|session recovery timed out' out/dmesg-reset.txt && { grep -Ei 'reset|recover' out/dmesg-reset.txt; fail "the kernel reports a failed reset"; }
read_blocks 10000 1 out/after-reset
cmp -s out/b out/after-reset || fail "data changed across the resets"
run_to pr-keys3.txt sg_persist --in --read-keys "$dev"
expect out/pr-keys3.txt "$key" "resets: the PR registration survives LUN and target reset"
state=$(cat "$(session_dir "$IQN")/state")
[ "$state" = LOGGED_IN ] || fail "session state after the resets: $state"
ok "resets: the disk answers and keeps its data; session $state"
run_to pr-unreg2.txt sg_persist --out --register --param-rk=$key --param-sark=0 "$dev"
check "logout" logout "$IQN" "$P"
[ "$failed" = 0 ] || fail "some sg3-utils checks failed (see above)"
echo "SG3 OK"
