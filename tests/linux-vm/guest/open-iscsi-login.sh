# shellcheck shell=dash
# Guest side of jobs/open-iscsi-login.sh: the Linux kernel initiator against `iscsi target` on the host.
# Checks SendTargets discovery; logins with no digests, HeaderDigest, DataDigest and both (CRC32C);
# one-way and mutual CHAP (MD5 and SHA-256), a wrong secret refused as an authorization failure;
# the LUN as a disk (mkfs.ext4, mount, copy a tree, fsck clean); fio write+verify at 4k and 1m, QD32,
# on a RAM and a file LUN; two sessions at once with fio on both; logout and re-login keep the data.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
# shellcheck source=open-iscsi-lib.sh
. ./open-iscsi-lib.sh
# shellcheck disable=SC1091 # written by the host job
. ./params.sh # PORT, PLAIN, CHAP, MUTUAL (target names), CHAP_USER/SECRET, MUTUAL_*
P=10.0.2.100:$PORT
start_iscsid

# 1. SendTargets discovery lists the three targets with the host's portal.
iscsiadm -m discovery -t st -p "$P" >out/discovery.txt
cat out/discovery.txt
for t in "$PLAIN" "$CHAP" "$MUTUAL"; do
    check "discovery lists $t" grep -q " $t\$" out/discovery.txt
done
# The records discovery made point at the host's 127.0.0.1: replace them with ones through the forward.
iscsiadm -m node -o delete >/dev/null 2>&1 || true
for t in "$PLAIN" "$CHAP" "$MUTUAL"; do node_new "$t" "$P"; done

# 2. Digests: each combination is negotiated as offered (the target accepts None and CRC32C), and
# data moves correctly under it (a small fio write+verify).
for hd in None CRC32C; do
    for dd in None CRC32C; do
        node_set "$PLAIN" "$P" 'node.conn[0].iscsi.HeaderDigest' "$hd"
        node_set "$PLAIN" "$P" 'node.conn[0].iscsi.DataDigest' "$dd"
        check "login HeaderDigest=$hd DataDigest=$dd" login "$PLAIN" "$P"
        got="$(negotiated "$PLAIN" HeaderDigest)/$(negotiated "$PLAIN" DataDigest)"
        [ "$got" = "$hd/$dd" ] || fail "negotiated digests $got, expected $hd/$dd"
        ok "negotiated digests $got"
        dev=$(disk "$PLAIN" 0)
        fio_verify "digest-$hd-$dd" "$dev" 8M 4k-256k
        check "logout" logout "$PLAIN" "$P"
    done
done

# 3. The disk under both digests: a file system, a copied tree, fsck clean; then fio at QD32,
# 4k and 1m, on the RAM LUN (0) and the file LUN (1).
check "login with both digests" login "$PLAIN" "$P"
ram=$(disk "$PLAIN" 0)
file=$(disk "$PLAIN" 1)
note "RAM LUN $ram, file LUN $file"
check "mkfs.ext4 on $ram" mkfs.ext4 -q -F "$ram"
mkdir -p /mnt/disk
check "mount" mount "$ram" /mnt/disk
check "copy /usr/share/doc and /usr/lib/python3" cp -a /usr/share/doc /usr/lib/python3 /mnt/disk/
(cd /usr/share && find doc -type f -exec md5sum {} + | sort -k2) >out/tree.md5
check "umount" umount /mnt/disk
fsck.ext4 -fn "$ram" >out/fsck.txt 2>&1 || { cat out/fsck.txt; fail "fsck.ext4 -fn finds errors"; }
ok "fsck.ext4 -fn is clean"
check "mount again" mount -o ro "$ram" /mnt/disk
(cd /mnt/disk && md5sum -c --quiet /mnt/host/out/tree.md5) >out/tree-check.txt 2>&1 || fail "copied tree differs"
ok "copied tree reads back identical ($(wc -l <out/tree.md5) files)"
umount /mnt/disk
fio_verify ram-4k "$ram" 32M 4k
fio_verify ram-1m "$ram" 64M 1m
fio_verify file-4k "$file" 32M 4k
fio_verify file-1m "$file" 64M 1m
# A pattern at the end of the file LUN, to find again after logout and re-login.
dd if=/dev/urandom of=out/pattern bs=64k count=16 status=none
check "write a pattern at the file LUN's end" dd if=out/pattern of="$file" bs=64k seek=$(( $(blockdev --getsize64 "$file") / 65536 - 16 )) oflag=direct status=none

# 4. CHAP: one-way (MD5, then SHA-256), mutual; a wrong secret is refused as an authorization failure.
node_set "$CHAP" "$P" node.session.auth.authmethod CHAP
node_set "$CHAP" "$P" node.session.auth.username "$CHAP_USER"
node_set "$CHAP" "$P" node.session.auth.password "wrong-$CHAP_SECRET"
rc=0; iscsiadm -m node -T "$CHAP" -p "$P" --login >out/wrong-secret.txt 2>&1 || rc=$?
cat out/wrong-secret.txt
[ "$rc" = 24 ] || fail "login with a wrong CHAP secret: exit $rc, expected 24"
grep -qi "authorization failure" out/wrong-secret.txt || fail "no 'authorization failure' in iscsiadm's error"
ok "a wrong CHAP secret is refused: exit 24, authorization failure"
node_set "$CHAP" "$P" node.session.auth.password "$CHAP_SECRET"
node_set "$CHAP" "$P" node.session.auth.chap_algs MD5
check "one-way CHAP (MD5) login" login "$CHAP" "$P"
check "logout" logout "$CHAP" "$P"
node_set "$CHAP" "$P" node.session.auth.chap_algs SHA256
check "one-way CHAP (SHA-256) login" login "$CHAP" "$P"
check "logout" logout "$CHAP" "$P"
node_set "$MUTUAL" "$P" node.session.auth.authmethod CHAP
node_set "$MUTUAL" "$P" node.session.auth.username "$MUTUAL_USER"
node_set "$MUTUAL" "$P" node.session.auth.password "$MUTUAL_SECRET"
node_set "$MUTUAL" "$P" node.session.auth.username_in "$MUTUAL_TARGET_USER"
node_set "$MUTUAL" "$P" node.session.auth.password_in "wrong-$MUTUAL_TARGET_SECRET"
rc=0; iscsiadm -m node -T "$MUTUAL" -p "$P" --login >out/wrong-target-secret.txt 2>&1 || rc=$?
[ "$rc" != 0 ] || fail "mutual CHAP accepted a target that does not know the secret"
ok "mutual CHAP: the initiator refuses a target answering with another secret (exit $rc)"
node_set "$MUTUAL" "$P" node.session.auth.password_in "$MUTUAL_TARGET_SECRET"
check "mutual CHAP login" login "$MUTUAL" "$P"

# 5. Two sessions at once (plain: 2 LUNs, mutual: 1 LUN), fio on three disks together.
m=$(disk "$MUTUAL" 0)
n=$(iscsiadm -m session | wc -l)
[ "$n" = 2 ] || fail "$n sessions, expected 2"
ok "two sessions at once"
fio_verify two-sessions "$ram" 16M 4k --name=file --filename="$file" --name=mutual --filename="$m"
check "logout of both" iscsiadm -m node --logoutall=all
# Re-login: the file LUN still holds the pattern.
check "re-login" login "$PLAIN" "$P"
file=$(disk "$PLAIN" 1)
dd if="$file" of=out/pattern-back bs=64k skip=$(( $(blockdev --getsize64 "$file") / 65536 - 16 )) count=16 iflag=direct status=none
check "the pattern is there after logout and re-login" cmp out/pattern out/pattern-back
check "final logout" logout "$PLAIN" "$P"
echo "OPEN-ISCSI LOGIN OK"
