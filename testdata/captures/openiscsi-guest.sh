# Runs inside the shared test VM (../shared/linux-vm/run) for record.sh --with-vm.
# open-iscsi logs in to tgt on the host (10.0.2.100:PORT, forwarded to 127.0.0.1:PORT) with
# HeaderDigest=CRC32C and DataDigest=CRC32C, does two small O_DIRECT writes and one read, logs out.
PORT=$(cat port)
IQN=iqn.2026-11.test:capture
P=10.0.2.100:$PORT
iscsid -f >/dev/null 2>&1 &
sleep 1
iscsiadm -m node -o new -T $IQN -p $P >/dev/null || exit 1
iscsiadm -m node -T $IQN -p $P -o update -n 'node.conn[0].iscsi.HeaderDigest' -v CRC32C || exit 1
iscsiadm -m node -T $IQN -p $P -o update -n 'node.conn[0].iscsi.DataDigest' -v CRC32C || exit 1
iscsiadm -m node -T $IQN -p $P --login || exit 1
dev=""
for i in $(seq 50); do
  dev=$(lsblk -ndo NAME,TRAN | awk '$2=="iscsi"{print $1; exit}')
  [ -n "$dev" ] && [ -b /dev/$dev ] && break; sleep 0.2
done
[ -n "$dev" ] || { echo "no iSCSI disk appeared"; exit 1; }
echo "disk: /dev/$dev"
python3 - /dev/$dev <<'PY' || exit 1
import mmap, os, sys
def pattern(off, n): return bytes(((off + i) * 7 + 3) % 251 for i in range(n))
fd = os.open(sys.argv[1], os.O_RDWR | os.O_DIRECT)
def aligned(data):
    m = mmap.mmap(-1, len(data)); m.write(data); return m
for off, n in ((0, 4096), (4096, 24576)):
    assert os.pwritev(fd, [aligned(pattern(off, n))], off) == n
m = mmap.mmap(-1, 28672)
assert os.preadv(fd, [m], 0) == 28672
assert m[:] == pattern(0, 28672), "read back differs"
os.close(fd)
print("io ok")
PY
iscsiadm -m session -P 2 | grep -E "Digest|MaxRecv|Burst|ImmediateData|InitialR2T" | tee out/negotiated.txt
iscsiadm -m node -T $IQN -p $P --logout || exit 1
echo OPEN-ISCSI OK
