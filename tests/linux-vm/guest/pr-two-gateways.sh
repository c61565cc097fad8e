# shellcheck shell=bash
# Guest side of jobs/pr-two-gateways.sh: persistent reservations through two gateways of one RBD
# image with open-iscsi and sg3-utils, as two initiators (two ifaces, each with its own name):
# A logs in to gateway 1, B to gateways 1 and 2. Every step is checked for its data, status or
# sense, not just an exit code. Handshake through the share: out/stop-gw1 -> ./gw1-stopped,
# out/cont-gw1 -> ./gw1-continued.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
# shellcheck source=open-iscsi-lib.sh
. ./open-iscsi-lib.sh
# shellcheck disable=SC1091 # written by the host job
. ./params.sh # PORT1, PORT2, IQN
P1=10.0.2.100:$PORT1
P2=10.0.2.100:$PORT2
NAME_A=iqn.2026-11.rs.iscsi.test:initiator-a
NAME_B=iqn.2026-11.rs.iscsi.test:initiator-b
start_iscsid
for i in a b; do
    iscsiadm -m iface -I "if$i" -o new >/dev/null
    name=NAME_${i^^}
    iscsiadm -m iface -I "if$i" -o update -n iface.initiatorname -v "${!name}" >/dev/null
done
# login_as IFACE PORTAL
login_as() {
    iscsiadm -m node -o new -T "$IQN" -p "$2" -I "$1" >/dev/null
    iscsiadm -m node -T "$IQN" -p "$2" -I "$1" --login >/dev/null
}
check "login as A to gateway 1" login_as ifa "$P1"
check "login as B to gateway 1" login_as ifb "$P1"
check "login as B to gateway 2" login_as ifb "$P2"

# disk_of INITIATOR PORTAL: the /dev/sdX of LUN 0 of the session of INITIATOR through PORTAL.
disk_of() {
    local s c b _
    for _ in $(seq 1 150); do
        for s in /sys/class/iscsi_session/session*; do
            [ "$(cat "$s/initiatorname" 2>/dev/null)" = "$1" ] || continue
            for c in "$s"/device/connection*/iscsi_connection/connection*; do
                [ "$(cat "$c/persistent_address" 2>/dev/null):$(cat "$c/persistent_port" 2>/dev/null)" = "$2" ] || continue
                for b in "$s"/device/target*/*:*:*:0/block/*; do
                    [ -b "/dev/${b##*/}" ] && { echo "/dev/${b##*/}"; return 0; }
                done
            done
        done
        sleep 0.2
    done
    fail "no disk of $1 through $2"
}
a1=$(disk_of "$NAME_A" "$P1")
b1=$(disk_of "$NAME_B" "$P1")
b2=$(disk_of "$NAME_B" "$P2")
note "A through gateway 1: $a1; B through gateway 1: $b1, through gateway 2: $b2"
# Commands to A's disk wait up to 120 s (not 30) before the kernel's error handling starts.
echo 120 >"/sys/block/${a1#/dev/}/device/timeout"

# pattern BYTE BLOCKS: BLOCKS 512-byte blocks of the byte BYTE (octal), into out/pattern-BYTE-BLOCKS.
pattern() { head -c $(($2 * 512)) /dev/zero | tr '\0' "\\$1" >"out/pattern-$1-$2"; echo "out/pattern-$1-$2"; }
# blocks_are DISK LBA COUNT BYTE: the COUNT blocks at LBA read through DISK (O_DIRECT) are all BYTE.
blocks_are() {
    dd if="$1" bs=512 skip="$2" count="$3" iflag=direct status=none | cmp -s - "$(pattern "$4" "$3")"
}
# write10 DISK LBA FILE: WRITE(10) of FILE (one block) at LBA with sg_raw; its report in out/.
write10() {
    local f
    f=out/write10-${1##*/}-$2.txt
    # shellcheck disable=SC2046 # the LBA's four bytes, as four words
    sg_raw -v -s 512 -i "$3" "$1" 2a 00 $(printf '%02x %02x %02x %02x' $(($2 >> 24 & 255)) $(($2 >> 16 & 255)) $(($2 >> 8 & 255)) $(($2 & 255))) 00 00 01 00 >"$f" 2>&1 || true
    echo "$f"
}
# expect FILE PATTERN WHAT: FILE matches the extended regex PATTERN (case-insensitive).
expect() { if grep -Eiq -- "$2" "$1"; then ok "$3"; else cat "$1"; fail "$3: no match for /$2/"; fi; }
prin() { sg_persist -n -i "$1" "$2" >"$3" 2>&1 || { cat "$3"; fail "sg_persist -i $1 $2"; }; }

# --- A registers (0xA) and reserves Write Exclusive, Registrants Only through gateway 1.
check "A registers key 0xa through gateway 1" sg_persist -n -o --register --param-sark=0xa "$a1"
check "A reserves (type 5, WERO) through gateway 1" sg_persist -n -o --reserve --param-rk=0xa --prout-type=5 "$a1"
for d in a1 b1 b2; do
    prin -k "${!d}" "out/keys-$d.txt"
    prin -r "${!d}" "out/res-$d.txt"
done
expect out/keys-a1.txt '1 registered reservation key' "READ KEYS: one key"
expect out/keys-a1.txt '^ +0xa$' "READ KEYS: 0xa"
expect out/res-a1.txt 'Key=0xa' "READ RESERVATION: held by 0xa"
expect out/res-a1.txt 'type: Write Exclusive, registrants only' "READ RESERVATION: Write Exclusive, Registrants Only"
check "READ KEYS the same through both gateways and both initiators" cmp out/keys-a1.txt out/keys-b1.txt
check "READ KEYS the same through gateway 2" cmp out/keys-a1.txt out/keys-b2.txt
check "READ RESERVATION the same through both gateways and both initiators" cmp out/res-a1.txt out/res-b1.txt
check "READ RESERVATION the same through gateway 2" cmp out/res-a1.txt out/res-b2.txt

# --- A, the holder, writes; B, unregistered, conflicts through either gateway.
check "A writes LBA 8 (0x11) through gateway 1" dd if="$(pattern 021 1)" of="$a1" bs=512 seek=8 oflag=direct status=none
check "B reads A's LBA 8 through gateway 2 (reads are open under WERO)" blocks_are "$b2" 8 1 021
expect "$(write10 "$b1" 9 "$(pattern 042 1)")" 'SCSI Status: Reservation Conflict' "B's WRITE(10) through gateway 1: RESERVATION CONFLICT"
expect "$(write10 "$b2" 9 "$(pattern 042 1)")" 'SCSI Status: Reservation Conflict' "B's WRITE(10) through gateway 2: RESERVATION CONFLICT"
if dd if="$(pattern 042 1)" of="$b2" bs=512 seek=9 oflag=direct status=none 2>out/dd-b2.txt; then
    fail "B's dd through gateway 2 succeeded"
fi
ok "B's dd through gateway 2 fails ($(head -1 out/dd-b2.txt))"
check "LBA 9 is still zero" blocks_are "$b2" 9 1 000
check "B registers key 0xb through gateway 2" sg_persist -n -o --register --param-sark=0xb "$b2"
prin -k "$b2" out/keys2-b2.txt
expect out/keys2-b2.txt '2 registered reservation keys' "READ KEYS through gateway 2: two keys"
expect out/keys2-b2.txt '^ +0xb$' "READ KEYS through gateway 2: 0xb"

# --- Gateway 1 stopped; A writes through it; B preempts A through gateway 2.
touch out/stop-gw1
for _ in $(seq 1 300); do [ -e gw1-stopped ] && break; sleep 0.1; done
[ -e gw1-stopped ] || fail "the host did not stop gateway 1"
# A's two writes: sent on the connection to the stopped gateway 1 (the disk's count of commands
# handed to iscsi_tcp goes up by both), where they wait in its socket. The kernel's NOP-Outs then
# time out (10 s) and it drops the connection: sg_raw's passthrough command fails there
# (DID_TRANSPORT_DISRUPTED), dd's is requeued until the session is back (replacement_timeout).
sent0=$(($(cat "/sys/block/${a1#/dev/}/device/iorequest_cnt")))
sg_raw -v -t 200 -s 2048 -i "$(pattern 104 4)" "$a1" 2a 00 00 00 00 64 00 00 04 00 >out/a-sgraw.txt 2>&1 &
a_sgraw=$!
dd if="$(pattern 104 4)" of="$a1" bs=2048 seek=$((104 * 512)) oflag=direct,seek_bytes status=none 2>out/a-dd.txt &
a_dd=$!
for _ in $(seq 1 100); do [ $(($(cat "/sys/block/${a1#/dev/}/device/iorequest_cnt") - sent0)) -ge 2 ] && break; sleep 0.1; done
sent=$(($(cat "/sys/block/${a1#/dev/}/device/iorequest_cnt") - sent0))
[ "$sent" -ge 2 ] || fail "A's writes were not sent to gateway 1 ($sent commands in 10 s)"
if ! kill -0 "$a_dd"; then cat out/a-dd.txt; fail "A's dd through the stopped gateway 1 did not wait"; fi
ok "A's writes (sg_raw LBAs 100-103, dd LBAs 104-107) sent to the stopped gateway 1; dd waits"
t0=$(date +%s.%N)
if ! timeout 120 sg_persist -n -o --preempt-abort --param-rk=0xb --param-sark=0xa --prout-type=5 "$b2" >out/preempt.txt 2>&1; then
    cat out/preempt.txt
    fail "B's PREEMPT AND ABORT through gateway 2"
fi
took=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN {printf "%.1f", a - b}')
ok "B's PREEMPT AND ABORT through gateway 2 completes with gateway 1 stopped"
note "preempt took $took s"
prin -k "$b2" out/keys3-b2.txt
prin -r "$b2" out/res3-b2.txt
expect out/keys3-b2.txt '1 registered reservation key' "READ KEYS after the preemption: one key"
expect out/keys3-b2.txt '^ +0xb$' "READ KEYS after the preemption: 0xb"
expect out/res3-b2.txt 'Key=0xb' "READ RESERVATION after the preemption: held by 0xb"
expect out/res3-b2.txt 'type: Write Exclusive, registrants only' "READ RESERVATION after the preemption: type 5"
if ! kill -0 "$a_dd"; then cat out/a-dd.txt; fail "A's dd ended while gateway 1 was stopped"; fi
ok "A's dd still waits"
check "B writes LBA 10 (0x33) through gateway 2" dd if="$(pattern 063 1)" of="$b2" bs=512 seek=10 oflag=direct status=none
touch out/cont-gw1
for _ in $(seq 1 300); do [ -e gw1-continued ] && break; sleep 0.1; done
[ -e gw1-continued ] || fail "the host did not continue gateway 1"

# --- Gateway 1 runs again: A's writes fail (bounded wait), none of them landed. (Those that find
# gateway 1 fenced end in BUSY and are sent again once it has rejoined, then meet the preemption.)
for _ in $(seq 1 1800); do kill -0 "$a_sgraw" 2>/dev/null || kill -0 "$a_dd" 2>/dev/null || break; sleep 0.1; done
kill -0 "$a_sgraw" 2>/dev/null && fail "A's sg_raw still waits 180 s after gateway 1 continued"
kill -0 "$a_dd" 2>/dev/null && fail "A's dd still waits 180 s after gateway 1 continued"
rc=0; wait "$a_sgraw" || rc=$?
note "A's sg_raw (exit $rc): $(grep -Ei 'status|sense|key|asc|error' out/a-sgraw.txt | tr '\n' ' ')"
[ "$rc" != 0 ] || { cat out/a-sgraw.txt; fail "A's WRITE(10) through gateway 1 succeeded"; }
ok "A's WRITE(10) through gateway 1 fails"
rc=0; wait "$a_dd" || rc=$?
note "A's dd (exit $rc): $(tr '\n' ' ' <out/a-dd.txt)"
[ "$rc" != 0 ] || fail "A's dd through gateway 1 succeeded"
ok "A's dd through the fenced gateway 1 fails"
dmesg | grep -Ei 'reservation|conflict|I/O error|critical' | tail -20 >out/dmesg-a.txt || true
check "LBAs 100-107 (A's writes) are zero through gateway 2" blocks_are "$b2" 100 8 000
check "LBA 10 is B's 0x33" blocks_are "$b2" 10 1 063
check "LBA 8 is A's 0x11" blocks_are "$b2" 8 1 021
check "LBA 9 is zero" blocks_are "$b2" 9 1 000

# --- Gateway 1 rejoins by itself (a new RADOS client, the record reloaded and joined again): its
# first commands after SIGCONT that reach the cluster find the old client blocklisted (NOT READY,
# LOGICAL UNIT COMMUNICATION FAILURE); once it has rejoined, it changes the record again (B
# registers through it: REGISTER AND IGNORE EXISTING KEY, which a retry repeats harmlessly) and
# the state it missed is in force through it.
rejoined=
for i in $(seq 1 60); do
    if sg_persist -n -o --register-ignore --param-sark=0xb "$b1" >out/register-b1.txt 2>&1; then rejoined=$i; break; fi
    sleep 0.5
done
[ -n "$rejoined" ] || { cat out/register-b1.txt; fail "gateway 1 did not rejoin within 30 s (B's REGISTER through it)"; }
ok "gateway 1 rejoined: B registers key 0xb through it (attempt $rejoined)"
check "B writes LBA 11 (0x55) through the rejoined gateway 1" dd if="$(pattern 125 1)" of="$b1" bs=512 seek=11 oflag=direct status=none
check "LBA 11 is B's 0x55 through gateway 2" blocks_are "$b2" 11 1 125
prin -k "$b1" out/keys4-b1.txt
prin -k "$b2" out/keys4-b2.txt
expect out/keys4-b1.txt '2 registered reservation keys' "READ KEYS through the rejoined gateway 1: 0xb for both of B's nexuses"
check "READ KEYS the same through gateway 2" cmp out/keys4-b1.txt out/keys4-b2.txt
# A's first command may get the preemption's unit attention; then RESERVATION CONFLICT.
for _ in 1 2 3 4 5; do
    f=$(write10 "$a1" 101 "$(pattern 042 1)")
    grep -q 'SCSI Status: Reservation Conflict' "$f" && break
done
expect "$f" 'SCSI Status: Reservation Conflict' "A's WRITE(10) through the rejoined gateway 1: RESERVATION CONFLICT"
check "LBA 101 (A's write after the rejoin) is zero" blocks_are "$b2" 101 1 000
echo "PR OK"
