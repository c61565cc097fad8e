# shellcheck shell=dash
# Guest side of jobs/fence-rejoin.sh: the kernel initiator (no multipath) writes at queue depth 32
# to an RBD LUN whose gateway's RADOS client the host blocklists by hand mid-run. The gateway
# rejoins with a new client (about a second); the commands that find it fenced end in BUSY, which
# the kernel's SCSI midlayer sends again. fio must see no I/O error, the kernel log none either,
# and a verify-only pass (fio's saved verify state) must find every acknowledged write.
# Handshake through the shared directory: the guest writes out/fio-started when writes are under
# way; the host writes ./fence-done once the gateway has said it rejoined.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
# shellcheck source=open-iscsi-lib.sh
. ./open-iscsi-lib.sh
# shellcheck disable=SC1091 # written by the host job
. ./params.sh # PORT, IQN
P=10.0.2.100:$PORT
start_iscsid
node_new "$IQN" "$P"
check "login" login "$IQN" "$P"
dev=$(disk "$IQN" 0)
note "disk $dev, $(blockdev --getsize64 "$dev") bytes"

# The write pass: random 16 KiB writes at QD32 over 160 MiB, each block with a CRC32C header, at
# most 500 a second, so that it lasts 20 s or more whatever the machine (the fence and the rejoin
# must fall inside it); fio saves which writes completed for the verify-only pass.
job=(--name=fence --filename="$dev" --ioengine=libaio --direct=1 --iodepth=32 --rw=randwrite
    --bs=16k --size=160M --verify=crc32c --verify_fatal=1 --verify_state_save=1)
dmesg -C
fio "${job[@]}" --do_verify=0 --rate_iops=500 --output=out/fio-write.txt >/dev/null 2>&1 &
fio_pid=$!
writes_under_way "$dev"
note "writes under way; the host blocklists the gateway's client now"
write_pass_ended "$fio_pid" out/fio-write.txt "the fence"
[ -e fence-done ] || fail "fio finished before the gateway had rejoined (make the write pass longer)"
ok "fio wrote 160 MiB at QD32 across the gateway's fence and rejoin without an I/O error"
dmesg >out/dmesg.txt
if grep -Ei 'I/O error|critical (target|medium|nexus|space)|Sense Key' out/dmesg.txt; then
    fail "the kernel logged errors across the fence"
fi
ok "the kernel logged no I/O error across the fence"
verify_only_pass out/fio-verify.txt "the fence" "${job[@]}"
echo "FENCE OK"
