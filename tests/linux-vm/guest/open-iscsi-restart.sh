# shellcheck shell=dash
# Guest side of jobs/open-iscsi-restart.sh: `iscsi target` is restarted on the host (first
# SIGINT: a graceful shutdown with a logout request; then SIGKILL) while the kernel initiator
# writes at queue depth 32 to a file LUN. The initiator must reconnect by itself (session
# recovery within replacement_timeout) and fio must see no I/O error; afterwards a verify-only pass (fio's saved verify state) must find every acknowledged write.
# Handshake through the shared directory: the guest writes out/fio-started when writes are under
# way; the host writes ./restarts-done when both restarts are over.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
# shellcheck source=open-iscsi-lib.sh
. ./open-iscsi-lib.sh
# shellcheck disable=SC1091 # written by the host job
. ./params.sh # PORT, IQN
P=10.0.2.100:$PORT
start_iscsid
node_new "$IQN" "$P"
# Hold commands for up to 120 s while the session is down; notice a dead connection within ~10 s
# (NOP-Out pings) even when no TCP reset arrives.
node_set "$IQN" "$P" node.session.timeo.replacement_timeout 120
node_set "$IQN" "$P" 'node.conn[0].timeo.noop_out_interval' 5
node_set "$IQN" "$P" 'node.conn[0].timeo.noop_out_timeout' 5
check "login" login "$IQN" "$P"
dev=$(disk "$IQN" 0)
note "disk $dev, $(blockdev --getsize64 "$dev") bytes"

# The write pass: random 16 KiB writes at QD32 over 160 MiB, each block with a CRC32C header; fio
# saves which writes completed (verify_state_save) for the verify-only pass.
job=(--name=restart --filename="$dev" --ioengine=libaio --direct=1 --iodepth=32 --rw=randwrite
    --bs=16k --size=160M --verify=crc32c --verify_fatal=1 --verify_state_save=1)
fio "${job[@]}" --do_verify=0 --output=out/fio-write.txt >/dev/null 2>&1 &
fio_pid=$!
# Tell the host once writes are really in flight.
writes_under_way "$dev"
note "writes under way; the host restarts the target now"
write_pass_ended "$fio_pid" out/fio-write.txt "the target restarts"
[ -e restarts-done ] || fail "fio finished before the host's restarts were over (make the write pass larger)"
ok "fio wrote 160 MiB at QD32 across two target restarts without an I/O error"
dmesg >out/dmesg.txt
# SIGINT: the target asks for a logout (AsyncEvent 1), iscsid logs out and logs in again by itself
# (the host counts the logins); SIGKILL: the connection just dies, a connection error here.
errors=$(grep -c 'detected conn error' out/dmesg.txt || true)
[ "$errors" -ge 1 ] || fail "the kernel saw no connection error, expected one for the SIGKILL"
ok "the initiator saw $errors connection error(s) and recovered the session by itself"
state=$(cat "$(session_dir "$IQN")/state")
[ "$state" = LOGGED_IN ] || fail "session state $state"
ok "session state $state"

# Every acknowledged write is on the disk (and in the host's file, which outlived the restarts).
verify_only_pass out/fio-verify.txt "the restarts" "${job[@]}"
check "logout" logout "$IQN" "$P"

# A cut connection (RFC 7143 7.1.4.1, ERL 0): the kernel initiator reaches the target through
# `iscsi fault-proxy`, which cuts the connection at the 3000th SCSI Command and again inside a PDU
# 60 MB into the next connection towards the target, while fio writes with verify at QD32. iscsid logs in
# again through the proxy and the block layer sends the commands again: fio must see no error, and
# the verify-only pass must find every acknowledged write.
PP=127.0.0.1:3290
./iscsi fault-proxy --listen $PP --to "$P" --fault 'cut@scsi-command#3000' \
    --fault 'cut-after=60000001@to-target' --log out/cut-faults.jsonl >out/cut-proxy.log 2>&1 &
proxy=$!
sleep 0.5
node_new "$IQN" "$PP"
node_set "$IQN" "$PP" node.session.timeo.replacement_timeout 120
errors_before=$(dmesg | grep -c 'detected conn error' || true)
check "login through the fault proxy" login "$IQN" "$PP"
dev=$(disk "$IQN" 0)
cut=(--name=cut --filename="$dev" --ioengine=libaio --direct=1 --iodepth=32 --rw=randwrite
    --bs=16k --size=160M --verify=crc32c --verify_fatal=1 --verify_state_save=1)
fio_rc=0
fio "${cut[@]}" --do_verify=0 --output=out/fio-cut.txt >/dev/null 2>&1 || fio_rc=$?
cat out/fio-cut.txt
[ "$fio_rc" = 0 ] || fail "fio failed across the cut connections (exit $fio_rc)"
grep -q 'err= 0' out/fio-cut.txt || fail "fio reports I/O errors across the cut connections"
cuts=$(grep -c '"fault":"cut' out/cut-faults.jsonl || true)
[ "$cuts" = 2 ] || fail "the proxy cut $cuts connections, expected 2 (out/cut-faults.jsonl)"
errors=$(( $(dmesg | grep -c 'detected conn error' || true) - errors_before ))
[ "$errors" -ge 2 ] || fail "the kernel saw $errors connection errors for 2 cuts"
ok "fio wrote 160 MiB at QD32 through 2 cut connections without an I/O error ($errors connection errors recovered)"
verify_only_pass out/fio-cut-verify.txt "the cut connections" "${cut[@]}"
check "logout through the fault proxy" logout "$IQN" "$PP"
kill "$proxy" 2>/dev/null
echo "RESTART OK"
