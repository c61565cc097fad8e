# shellcheck shell=dash
# Guest side of jobs/iser-open-iscsi.sh: the Linux kernel's iSER initiator (ib_iser over soft iWARP,
# siw) against `iscsi target --iser` on the host, reached through the forward 10.0.2.100:PORT.
# siw up (siw-up.sh); a node record on the built-in `iser` iface; login, the session's transport
# checked to be iser; mkfs.ext4 + mount + copy + umount + fsck clean; fio randwrite+verify at QD32
# with 4k and 1m blocks; a pattern written, logout, login again, the pattern read back; logout.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
# shellcheck source=open-iscsi-lib.sh
. ./open-iscsi-lib.sh
# shellcheck disable=SC1091 # written by the host job
. ./params.sh # PORT (the target's iSER portal on the host), IQN, LUN (default 0)
LUN=${LUN:-0}
P=10.0.2.100:$PORT
sh ./siw-up.sh ./siw.ko >out/siw-up.txt 2>&1 || { cat out/siw-up.txt; fail "soft iWARP (siw) up"; }
ok "$(tail -1 out/siw-up.txt)"
start_iscsid

# SendTargets would answer with the host's own 127.0.0.1 portal: the record is made by hand, on the
# `iser` iface (built into open-iscsi: transport_name iser). A failed login gives up after 3 tries.
iscsiadm -m node -o new -T "$IQN" -p "$P" -I iser >/dev/null || fail "iscsiadm -m node -o new ... -I iser"
node_set "$IQN" "$P" node.session.initial_login_retry_max 3
iser_login() {
    local what=$1 rc=0
    iscsiadm -m node -T "$IQN" -p "$P" --login >out/login.txt 2>&1 || rc=$?
    if [ "$rc" != 0 ]; then
        cat out/login.txt
        # The MPA exchange and ib_iser's view of the connection are in the kernel log.
        fail "$what: iSER login to $IQN at $P (iscsiadm exit $rc)"
    fi
    iscsiadm -m session >out/session.txt 2>&1 || true
    grep -q "^iser: .* $IQN" out/session.txt || { cat out/session.txt; fail "$what: the session is not on the iser transport"; }
    ok "$what: $(cat out/session.txt)"
}
iser_login "login over iSER"
dev=$(disk "$IQN" "$LUN")
note "LUN $LUN is $dev ($(blockdev --getsize64 "$dev") bytes)"

# A file system on the disk, a copied tree read back, fsck clean.
check "mkfs.ext4 on $dev" mkfs.ext4 -q -F "$dev"
mkdir -p /mnt/disk
check "mount" mount "$dev" /mnt/disk
check "copy /usr/share/doc" cp -a /usr/share/doc /mnt/disk/
(cd /usr/share && find doc -type f -exec md5sum {} + | sort -k2) >out/tree.md5
check "umount" umount /mnt/disk
fsck.ext4 -fn "$dev" >out/fsck.txt 2>&1 || { cat out/fsck.txt; fail "fsck.ext4 -fn finds errors"; }
ok "fsck.ext4 -fn is clean"
check "mount again (read-only)" mount -o ro "$dev" /mnt/disk
(cd /mnt/disk && md5sum -c --quiet /mnt/host/out/tree.md5) >out/tree-check.txt 2>&1 || fail "copied tree differs"
ok "copied tree reads back identical ($(wc -l <out/tree.md5) files)"
umount /mnt/disk

# fio at QD32 (RDMA Reads for the writes' data, RDMA Writes for the verify reads), 4k and 1m.
fio_verify iser-4k "$dev" 32M 4k
fio_verify iser-1m "$dev" 64M 1m
# A pattern at the LUN's end, to find again after logout and a new login.
dd if=/dev/urandom of=out/pattern bs=64k count=16 status=none
check "write a pattern at the LUN's end" dd if=out/pattern of="$dev" bs=64k seek=$(( $(blockdev --getsize64 "$dev") / 65536 - 16 )) oflag=direct status=none
check "logout" logout "$IQN" "$P"

iser_login "login again over iSER"
dev=$(disk "$IQN" "$LUN")
dd if="$dev" of=out/pattern-back bs=64k skip=$(( $(blockdev --getsize64 "$dev") / 65536 - 16 )) count=16 iflag=direct status=none
check "the pattern is there after logout and a new login" cmp out/pattern out/pattern-back
check "final logout" logout "$IQN" "$P"
echo "ISER OPEN-ISCSI OK"
