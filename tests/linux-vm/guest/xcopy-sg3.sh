# shellcheck shell=dash
# Guest side of jobs/xcopy-sg3.sh: sg_xcopy (sg3-utils) through the Linux kernel initiator against
# `iscsi target`'s two RAM LUNs. The copy runs inside the target (EXTENDED COPY with identification
# CSCD descriptors taken from each LU's VPD page 0x83), so the data checked here never crossed the
# wire from the initiator: it is read back with O_DIRECT and compared with what was written.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
# shellcheck source=open-iscsi-lib.sh
. ./open-iscsi-lib.sh
# shellcheck disable=SC1091 # written by the host job
. ./params.sh # PORT, IQN, SIZE_BYTES (each LUN's size)
P=10.0.2.100:$PORT
start_iscsid
node_new "$IQN" "$P"
check "login" login "$IQN" "$P"
dev0=$(disk "$IQN" 0)
dev1=$(disk "$IQN" 1)
sg0=$(sg_of "$dev0") || fail "no sg device for $dev0"
sg1=$(sg_of "$dev1") || fail "no sg device for $dev1"
note "LUN 0 $dev0 $sg0, LUN 1 $dev1 $sg1"

# read_blocks DEV LBA COUNT FILE: COUNT 512-byte blocks at LBA, straight from the disk (O_DIRECT).
read_blocks() {
    dd if="$1" of="$4" bs=1M skip=$(($2 * 512)) count=$(($3 * 512)) \
        iflag=direct,skip_bytes,count_bytes status=none
}
# write_blocks FILE DEV LBA: writes FILE at LBA (O_DIRECT).
write_blocks() {
    dd if="$1" of="$2" bs=1M seek=$(($3 * 512)) oflag=direct,seek_bytes conv=notrunc status=none
}
# same A B WHAT: the two files are byte-identical (sha256 shown for the log).
same() {
    local a b
    a=$(sha256sum <"$1" | cut -c1-64)
    b=$(sha256sum <"$2" | cut -c1-64)
    [ "$a" = "$b" ] && cmp -s "$1" "$2" || fail "$3: sha256 $a != $b"
    ok "$3 (sha256 ${a:0:16}...)"
}

# --- The target says it can: 3PC in INQUIRY, the copy manager's operating parameters.
sg_inq "$dev0" >out/inq.txt 2>&1 || { cat out/inq.txt; fail "sg_inq"; }
grep -Eq '3PC=1' out/inq.txt || { cat out/inq.txt; fail "INQUIRY: 3PC is not set"; }
ok "INQUIRY: 3PC=1"
# RECEIVE COPY RESULTS, OPERATING PARAMETERS (service action 3), as raw bytes.
sg_raw -r 64 "$dev0" 84 03 00 00 00 00 00 00 00 00 00 00 00 40 00 00 >out/rcr.txt 2>&1 ||
    { cat out/rcr.txt; fail "RECEIVE COPY RESULTS (OPERATING PARAMETERS)"; }
grep -Eq '^ +00 +00 00 00 2a' out/rcr.txt || { cat out/rcr.txt; fail "OPERATING PARAMETERS: AVAILABLE DATA"; }
ok "RECEIVE COPY RESULTS: OPERATING PARAMETERS answered"

# --- 8 MiB of a known pattern on LUN 0 at LBA 0, copied by the target to LUN 1 at LBA 2048.
blocks=16384
head -c $((blocks * 512)) /dev/urandom >out/pattern
write_blocks out/pattern "$dev0" 0
read_blocks "$dev0" 0 $blocks out/lun0
same out/pattern out/lun0 "the pattern is on LUN 0"
sg_xcopy if="$sg0" of="$sg1" bs=512 count=$blocks skip=0 seek=2048 >out/xcopy1.txt 2>&1 ||
    { cat out/xcopy1.txt; fail "sg_xcopy LUN 0 -> LUN 1 exited non-zero"; }
read_blocks "$dev1" 2048 $blocks out/lun1
same out/pattern out/lun1 "sg_xcopy: LUN 0 LBA 0 -> LUN 1 LBA 2048, 8 MiB"
read_blocks "$dev1" 2047 1 out/before
head -c 512 /dev/zero >out/zero-block
same out/zero-block out/before "sg_xcopy: nothing written before the destination range"
read_blocks "$dev1" $((2048 + blocks)) 1 out/after
same out/zero-block out/after "sg_xcopy: nothing written after the destination range"

# --- Within one LU: LUN 1's copy moved on to LBA 65536 (sent to the destination, oflag=xcopy
# where this sg_xcopy has it; else to the source as before).
sg_xcopy if="$sg1" of="$sg1" bs=512 count=$blocks skip=2048 seek=65536 >out/xcopy2.txt 2>&1 ||
    { cat out/xcopy2.txt; fail "sg_xcopy within LUN 1 exited non-zero"; }
read_blocks "$dev1" 65536 $blocks out/lun1-moved
same out/pattern out/lun1-moved "sg_xcopy: within LUN 1, LBA 2048 -> 65536"

# --- Past the end of LUN 1: refused (COPY ABORTED), nothing written.
last=$((SIZE_BYTES / 512))
rc=0
sg_xcopy if="$sg0" of="$sg1" bs=512 count=128 skip=0 seek=$((last - 64)) >out/xcopy3.txt 2>&1 || rc=$?
[ "$rc" != 0 ] || { cat out/xcopy3.txt; fail "sg_xcopy past the end of LUN 1 succeeded"; }
read_blocks "$dev1" $((last - 64)) 64 out/tail
head -c $((64 * 512)) /dev/zero >out/zero-tail
same out/zero-tail out/tail "sg_xcopy past the end: refused (exit $rc), the last blocks untouched"

check "logout" logout "$IQN" "$P"
echo "XCOPY OK"
