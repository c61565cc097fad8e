#!/usr/bin/env bash
# open-iscsi (the Linux kernel initiator, in the VM) against `iscsi target` on the host: discovery,
# digests, CHAP (one-way, mutual, wrong secret), a file system, fio write+verify on a RAM and a file
# LUN, two sessions at once, logout and re-login. Guest side: guest/open-iscsi-login.sh.
set -euo pipefail
# shellcheck source=tests/linux-vm/lib.sh
source "$(dirname "$0")/../lib.sh"
vm_setup
port=$(vm_free_port)
base=iqn.2026-11.rs.iscsi.test
# The target: three targets on one portal; digests None and CRC32C both acceptable (the default).
cat >target.toml <<TOML
listen = ["127.0.0.1:$port"]
[negotiation]
header_digest = ["None", "CRC32C"]
data_digest = ["None", "CRC32C"]
[[target]]
name = "$base:plain"
luns = ["ram:256M", "file:$VM_WORK/lun1.img,size=256M"]
[[target]]
name = "$base:chap"
luns = ["ram:16M"]
chap = { user = "linux-vm", secret = "one-way-secret-16" }
[[target]]
name = "$base:mutual"
luns = ["ram:64M"]
chap = { user = "linux-vm-m", secret = "mutual-secret-in-1", target_user = "iscsi-rs", target_secret = "mutual-secret-out2" }
TOML
cat >params.sh <<PARAMS
PORT=$port
PLAIN=$base:plain CHAP=$base:chap MUTUAL=$base:mutual
CHAP_USER=linux-vm CHAP_SECRET=one-way-secret-16
MUTUAL_USER=linux-vm-m MUTUAL_SECRET=mutual-secret-in-1
MUTUAL_TARGET_USER=iscsi-rs MUTUAL_TARGET_SECRET=mutual-secret-out2
PARAMS
target_start t0 "$port" --config target.toml
guest=$LINUX_VM_DIR/guest
rc=0
vm_run --to-host "$port" --timeout 900 "$guest/open-iscsi-login.sh" "$guest/open-iscsi-lib.sh" params.sh || rc=$?
grep -E '^(ok|not ok) - ' console.log || true
target_alive t0 || vm_fail "the target died"
[ "$rc" = 0 ] || vm_fail "guest script exit $rc"
grep -q '^OPEN-ISCSI LOGIN OK' console.log || vm_fail "the guest did not finish"
vm_log "pass"
