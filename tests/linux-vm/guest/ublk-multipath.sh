# shellcheck shell=bash
# Guest side of jobs/ublk-multipath.sh: `iscsi attach` over the two gateways of one group (a URL
# each) as one ublk device; fio writes at QD32 with CRC32C verify while the host SIGKILLs the
# owner; no I/O error, every acknowledged write read back, the time from the kill to the device's
# first completed write after it; the killed gateway started again, its path works again (the
# attach's log says so); detach.
# Handshake through the share: the guest writes out/writing, the host kills the owner and writes
# ./target-killed; the guest writes out/restart-target, the host starts it and writes
# ./target-restarted.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
# shellcheck source=open-iscsi-lib.sh
. ./open-iscsi-lib.sh
# shellcheck disable=SC1091 # written by the host job
. ./params.sh # PORT1, PORT2, IQN
url1=iscsi://10.0.2.100:$PORT1/$IQN/0
url2=iscsi://10.0.2.100:$PORT2/$IQN/0

modprobe ublk_drv || fail "no ublk_drv in this kernel ($(uname -r))"
RUST_LOG=info ./iscsi attach "$url1" "$url2" --queues 2 --depth 64 >out/attach.out 2>out/attach.log &
attach_pid=$!
dev=
for _ in $(seq 1 600); do
    dev=$(head -1 out/attach.out 2>/dev/null || true)
    [ -n "$dev" ] && [ -b "$dev" ] && break
    kill -0 "$attach_pid" 2>/dev/null || { cat out/attach.log >&2; fail "iscsi attach exited"; }
    dev=
    sleep 0.1
done
[ -n "$dev" ] || { cat out/attach.log >&2; fail "iscsi attach printed no device within 60 s"; }
grep -q "I/O goes to this path" out/attach.log || fail "the attach chose no path"
ok "iscsi attach over two gateways: $dev ($(grep -o 'I/O goes to this path.*' out/attach.log | tail -1))"
writes() { awk '{print $5}' "/sys/block/${dev#/dev/}/stat"; }

job=(--name=ublk-mp --filename="$dev" --ioengine=libaio --direct=1 --iodepth=32 --rw=randwrite
    --bs=16k --size=160M --verify=crc32c --verify_fatal=1 --verify_state_save=1)
fio "${job[@]}" --do_verify=0 --output=out/fio-write.txt >/dev/null 2>&1 &
fio_pid=$!
w0=$(writes)
for _ in $(seq 1 100); do
    [ $(($(writes) - w0)) -gt 200 ] && break
    sleep 0.1
done
[ $(($(writes) - w0)) -gt 200 ] || fail "fio completed no writes through $dev"
touch out/writing
failover_after_kill writes "$fio_pid" "$dev"
ms=$failover_ms
ok "failover: the first write completed through $dev $(seconds_of "$ms") s after the kill"
write_pass_ended "$fio_pid" out/fio-write.txt "the owner's SIGKILL"
ok "fio wrote 160 MiB at QD32 across the owner's SIGKILL without an I/O error"
verify_only_pass out/fio-verify.txt "the failover" "${job[@]}"

restart_killed
back=
for _ in $(seq 1 300); do
    grep -q "path works again" out/attach.log && { back=1; break; }
    sleep 0.1
done
[ -n "$back" ] || { tail -20 out/attach.log; fail "the restarted gateway's path did not work again within 30 s"; }
ok "the restarted gateway's path works again"
dd if="$dev" of=/dev/null bs=1M count=16 iflag=direct 2>/dev/null || fail "read through $dev after the restart"
./iscsi detach "$dev" || fail "iscsi detach $dev"
rc=0
for _ in $(seq 1 300); do kill -0 "$attach_pid" 2>/dev/null || break; sleep 0.1; done
wait "$attach_pid" || rc=$?
[ "$rc" = 0 ] || { tail -20 out/attach.log; fail "iscsi attach exited $rc after detach"; }
ok "detach: the device gone, every path logged out"
echo "UBLK MULTIPATH OK failover_ms=$ms"
