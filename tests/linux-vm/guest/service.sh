# shellcheck shell=bash
# Guest side of jobs/service.sh, run by systemd (run --systemd: systemd is PID 1): the iscsi-rs .deb
# installed with dpkg, the iscsi-target service started from the example configuration as
# installed, the kernel initiator (open-iscsi) logged in through SendTargets discovery, data
# written and read back, `iscsi target status` over the control socket; a second target appended
# to the file and `systemctl reload` (SIGHUP, Type=notify-reload): applied, the session kept;
# `systemctl stop` with the session still logged in, which must end with Result=success (no
# timeout, no SIGKILL). Then the hardening against real LUNs: a file LUN under /srv and a block LUN
# (/dev/vdb) served by the same unit, written and read back, and stopped the same way.
# The journal of the unit and systemctl status go to out/ whatever happens.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
# shellcheck source=open-iscsi-lib.sh
. ./open-iscsi-lib.sh
unit=iscsi-target.service
portal=127.0.0.1:3260

# What the unit did, for the host (vm-out/) and, on failure, the console.
save_journal() {
    journalctl -u "$unit" --no-pager -o short-monotonic >out/journal.txt 2>&1 || true
    systemctl status "$unit" --no-pager -l >out/status.txt 2>&1 || true
    journalctl -b --no-pager -p warning >out/journal-warnings.txt 2>&1 || true
}
on_exit() {
    local rc=$?
    save_journal
    # A session left to recover from a stopped target holds the power-off for its 120 s timeout.
    iscsiadm -m node --logoutall=all >/dev/null 2>&1 || true
    if [ "$rc" != 0 ]; then
        echo "--- journal of $unit (tail):"
        tail -40 out/journal.txt
        echo "--- systemctl status:"
        cat out/status.txt
    fi
}
trap on_exit EXIT
prop() { systemctl show -p "$2" --value "$1"; }
# port_open: 127.0.0.1:3260 accepts a connection now.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/3260") 2>/dev/null; }
# pattern FILE: 1 MiB of random data.
pattern() { head -c 1048576 /dev/urandom >"$1"; }
# write_read DISK SEED OFFSET_MIB: writes a pattern at OFFSET_MIB and reads it back, bypassing the
# page cache both ways.
write_read() {
    pattern "/tmp/w-$2"
    dd if="/tmp/w-$2" of="$1" bs=1M count=1 seek="$3" oflag=direct conv=fsync status=none &&
        dd if="$1" of="/tmp/r-$2" bs=1M count=1 skip="$3" iflag=direct status=none &&
        cmp -s "/tmp/w-$2" "/tmp/r-$2"
}
# still_there DISK SEED OFFSET_MIB: the pattern written earlier reads back the same.
still_there() {
    dd if="$1" of="/tmp/r2-$2" bs=1M count=1 skip="$3" iflag=direct status=none && cmp -s "/tmp/w-$2" "/tmp/r2-$2"
}
# stop_clean WHAT: systemctl stop, which must leave Result=success: the target exited by itself
# after SIGTERM, with status 0, within TimeoutStopSec (no SIGKILL). systemd says "Main process
# exited, code=..." only of an exit with another status or by a signal, and "Deactivated
# successfully" of a clean one (ExecMainStatus is reset once the unit is inactive).
stop_clean() {
    local t0 t1 result journal
    t0=$(date +%s.%N)
    check "$1: systemctl stop returns" systemctl stop "$unit"
    t1=$(date +%s.%N)
    note "$1: stop took $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}') s"
    result=$(prop "$unit" Result)
    [ "$result" = success ] || fail "$1: Result=success after the stop (Result=$result)"
    journal=$(journalctl -u "$unit" --no-pager -o cat)
    ! grep -E 'Main process exited|SIGKILL|Failed with result' <<<"$journal" ||
        fail "$1: the journal reports an unclean end"
    [ "$(grep -c 'Deactivated successfully' <<<"$journal")" = "$2" ] ||
        fail "$1: the journal says 'Deactivated successfully' ($2 times by now)"
    ok "$1: stopped cleanly (Result=success, exit status 0, no SIGKILL)"
}

note "$(systemctl --version | head -1)"
[ "$(cat /proc/1/comm)" = systemd ] || fail "PID 1 is $(cat /proc/1/comm), not systemd"

# --- the package -----------------------------------------------------------------------------------
check "dpkg -i the package" dpkg -i ./iscsi-rs.deb
[ "$(dpkg-query -W -f='${Status}' iscsi-rs)" = "install ok installed" ] || fail "iscsi-rs installed"
for f in /usr/bin/iscsi /lib/systemd/system/$unit /etc/iscsi-rs/target.toml \
    /usr/share/doc/iscsi-rs/copyright /usr/share/doc/iscsi-rs/README.service; do
    [ -e "$f" ] || fail "the package installs $f"
done
[ "$(stat -c %a /etc/iscsi-rs/target.toml)" = 600 ] || fail "target.toml is mode 0600"
ok "the package installs the binary, the unit, the configuration (0600) and the docs"
# The postinst reloaded systemd: the unit is known, as notify-reload, and not enabled or started.
[ "$(prop $unit LoadState)" = loaded ] || fail "systemd knows $unit after dpkg -i ($(prop $unit LoadState))"
[ "$(prop $unit Type)" = notify-reload ] || fail "$unit is Type=notify-reload ($(prop $unit Type))"
[ "$(prop $unit ActiveState)" = inactive ] || fail "dpkg -i does not start $unit"
ok "systemd loaded $unit (Type=notify-reload), not started"
# iscsid as systemd runs it (the library's start_iscsid starts it by hand, as under guest-init).
systemctl start iscsid.service || fail "systemctl start iscsid"
for _ in $(seq 1 50); do
    rc=0; iscsiadm -m session >/dev/null 2>&1 || rc=$?
    [ "$rc" = 0 ] || [ "$rc" = 21 ] && break
    sleep 0.2
done

# --- the example configuration, readiness ------------------------------------------------------------
iqn=$(sed -n 's/^name = "\(.*\)"$/\1/p' /etc/iscsi-rs/target.toml | head -1)
[ -n "$iqn" ] || fail "a target name in the example configuration"
port_open && fail "something listens on $portal before the service starts"
check "systemctl start $unit" systemctl start "$unit"
# Type=notify: start returned only after READY=1, which the target sends once its portals listen.
port_open || fail "$portal accepts connections as soon as systemctl start returned (readiness)"
ok "listening on $portal when systemctl start returned (READY=1 after the bind)"
[ "$(prop $unit ActiveState)" = active ] || fail "$unit active"
status_text=$(prop $unit StatusText)
[ "$status_text" = "serving 1 target on $portal" ] || fail "the status line: '$status_text'"
ok "status line: $status_text"
pid=$(prop $unit MainPID)

# --- open-iscsi: discovery, login, I/O -------------------------------------------------------------------
iscsiadm -m discovery -t sendtargets -p "$portal" >out/discovery.txt 2>&1 || fail "SendTargets discovery"
grep -q " $iqn\$" out/discovery.txt || fail "discovery lists $iqn: $(cat out/discovery.txt)"
ok "SendTargets discovery lists $iqn"
check "login" login "$iqn" "$portal"
dev=$(disk "$iqn" 0)
sid=$(session_dir "$iqn")
check "write and read back 1 MiB on $dev" write_read "$dev" a 0

# The control socket, in the unit's RuntimeDirectory (/run/iscsi-rs, 0700), answers for the session.
iscsi target status >out/status-1.txt 2>&1 || fail "iscsi target status: $(cat out/status-1.txt)"
grep -q "$(sed -n 's/^InitiatorName=//p' /etc/iscsi/initiatorname.iscsi)" out/status-1.txt ||
    fail "iscsi target status lists the session: $(cat out/status-1.txt)"
ok "iscsi target status (control socket /run/iscsi-rs/target.sock) lists the session"

# --- reload -----------------------------------------------------------------------------------------------
# A change to apply live: a second target beside the one in use.
added=iqn.2026-11.rs.iscsi.test:service-added
printf '\n[[target]]\nname = "%s"\nluns = ["ram:16M"]\n' "$added" >>/etc/iscsi-rs/target.toml
check "systemctl reload $unit (SIGHUP, waits for RELOADING=1 ... READY=1)" systemctl reload "$unit"
[ "$(prop $unit ActiveState)" = active ] || fail "$unit active after the reload"
[ "$(prop $unit MainPID)" = "$pid" ] || fail "the same process after the reload ($pid, now $(prop $unit MainPID))"
[ "$(prop $unit NRestarts)" = 0 ] || fail "no restart during the reload"
journalctl -u "$unit" --no-pager | grep -q 'Reloaded' || fail "the journal shows the reload (systemd's 'Reloaded ...')"
ok "reloaded: same PID $pid, no restart, 'Reloaded' in the journal"
status_text=$(prop $unit StatusText)
[[ $status_text == "serving 2 targets on $portal (reloaded: "* ]] || fail "the status line after the reload: '$status_text'"
ok "status line: $status_text"
iscsiadm -m discovery -t sendtargets -p "$portal" >out/discovery-2.txt 2>&1 || fail "discovery after the reload"
grep -q " $added\$" out/discovery-2.txt || fail "discovery lists the target added by the reload: $(cat out/discovery-2.txt)"
ok "discovery lists $added, added by the reload"
[ "$(session_dir "$iqn")" = "$sid" ] || fail "the session survives the reload"
[ "$(cat "$sid/state" 2>/dev/null || echo LOGGED_IN)" = LOGGED_IN ] || fail "the session is logged in"
check "the data written before the reload reads back" still_there "$dev" a 0
check "write and read back 1 MiB after the reload" write_read "$dev" b 1

# --- stop with the session logged in ----------------------------------------------------------------------
stop_clean "example configuration" 1
logout "$iqn" "$portal" 2>/dev/null || true
node_delete "$iqn" "$portal"

# --- the hardening against file and block LUNs ------------------------------------------------------------
# The same unit serving a file under /srv (created by the target) and the VM's disk /dev/vdb.
disks=iqn.2026-11.rs.iscsi.test:service-disks
mkdir -p /srv/iscsi
cat >/etc/iscsi-rs/target.toml <<EOF
listen = ["$portal"]
[[target]]
name = "$disks"
luns = ["file:/srv/iscsi/disk0.img,size=32M", "block:/dev/vdb"]
EOF
check "systemctl start with a file and a block LUN" systemctl start "$unit"
[ "$(stat -c %a /srv/iscsi/disk0.img)" = 600 ] || fail "the LUN file is created 0600 (UMask=0077)"
ok "the target created /srv/iscsi/disk0.img, mode 0600"
node_new "$disks" "$portal"
check "login to $disks" login "$disks" "$portal"
file_dev=$(disk "$disks" 0)
block_dev=$(disk "$disks" 1)
check "write and read back on the file LUN ($file_dev)" write_read "$file_dev" c 3
check "write and read back on the block LUN ($block_dev)" write_read "$block_dev" d 5
stop_clean "file and block LUNs" 2
logout "$disks" "$portal" 2>/dev/null || true
# What reached the backing stores, read past the target: the file and the disk hold the patterns.
cmp -s /tmp/w-c <(dd if=/srv/iscsi/disk0.img bs=1M count=1 skip=3 status=none) || fail "the file LUN's data is in /srv/iscsi/disk0.img"
cmp -s /tmp/w-d <(dd if=/dev/vdb bs=1M count=1 skip=5 iflag=direct status=none) || fail "the block LUN's data is on /dev/vdb"
ok "the data is in the file and on the disk"
echo "SERVICE OK"
