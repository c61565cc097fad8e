#!/usr/bin/env python3
"""Configure the Linux kernel's iSCSI target (LIO) inside the test VM, through rtslib-fb.

Usage (in the guest, as root):
  python3 lio-target.py [--iqn IQN] [--size MiB] [--luns N] [--port N] [--ramdisk]
                        [--chap USER:SECRET] [--mutual USER:SECRET] [--digest]
                        [--max-connections N] [--clear]

Serves LUNs 0..N-1 of IQN on 0.0.0.0:PORT (default iqn.2026-11.org.example:lio, 3260), to any
initiator (demo mode: generated node ACLs, writable). Each LUN is a file backstore in the guest's
/tmp (tmpfs) with LIO's optional SBC features on (thin provisioning with UNMAP and WRITE SAME,
COMPARE AND WRITE, XCOPY, persistent reservations), or with --ramdisk LIO's rd_mcp backstore.
  --chap USER:SECRET    one-way CHAP: the initiator must prove USER/SECRET (RFC 7143 12.1.3)
  --mutual USER:SECRET  mutual CHAP: the target answers the initiator's challenge as USER/SECRET
  --digest              HeaderDigest and DataDigest CRC32C required (LIO's default offers CRC32C,None)
  --max-connections N   the TPG's MaxConnections (MC/S; LIO's default is 1)
  --clear               remove any existing LIO configuration first (to reconfigure in one boot)
"""
import argparse
import os

import rtslib_fb as rts

ap = argparse.ArgumentParser()
ap.add_argument("--iqn", default="iqn.2026-11.org.example:lio")
ap.add_argument("--size", type=int, default=256, help="MiB per LUN")
ap.add_argument("--luns", type=int, default=1)
ap.add_argument("--port", type=int, default=3260)
ap.add_argument("--ramdisk", action="store_true")
ap.add_argument("--chap", help="USER:SECRET for one-way CHAP")
ap.add_argument("--mutual", help="USER:SECRET the target proves (mutual CHAP; needs --chap)")
ap.add_argument("--digest", action="store_true", help="require CRC32C header and data digests")
ap.add_argument("--max-connections", type=int, default=1)
ap.add_argument("--erl", type=int, default=0, help="the highest ErrorRecoveryLevel LIO accepts")
ap.add_argument("--clear", action="store_true")
a = ap.parse_args()
if a.mutual and not a.chap:
    ap.error("--mutual needs --chap")

root = rts.RTSRoot()
if a.clear:
    root.clear_existing(confirm=True)
    for n in range(16):
        try:
            os.unlink(f"/tmp/lio-lun{n}.img")
        except FileNotFoundError:
            pass

size = a.size * 1024 * 1024
# LIO keeps persistent-reservation (APTPL) state in <dbroot>/pr: without that directory every
# PERSISTENT RESERVE OUT fails with NOT READY. rtslib-fb moves dbroot (to /etc/rtslib-fb-target on
# Debian) when it loads: take the kernel's current value.
dbroots = {"/etc/target", "/var/target", "/etc/rtslib-fb-target"}
try:
    with open("/sys/kernel/config/target/dbroot") as f:
        dbroots.add(f.read().strip())
except OSError:
    pass
for d in dbroots:
    os.makedirs(os.path.join(d, "pr"), exist_ok=True)
tpg = rts.TPG(rts.Target(rts.FabricModule("iscsi"), a.iqn), 1)
for n in range(a.luns):
    if a.ramdisk:
        so = rts.RDMCPStorageObject(f"lun{n}", size=size)
    else:
        path = f"/tmp/lio-lun{n}.img"
        with open(path, "wb") as f:
            f.truncate(size)
        so = rts.FileIOStorageObject(f"lun{n}", path, size=size, write_back=False)
        for attr in ("emulate_tpu", "emulate_tpws", "emulate_caw", "emulate_3pc", "emulate_pr"):
            so.set_attribute(attr, "1")
    rts.LUN(tpg, n, so)
rts.NetworkPortal(tpg, "0.0.0.0", a.port)
tpg.set_attribute("generate_node_acls", "1")
tpg.set_attribute("cache_dynamic_acls", "1")
tpg.set_attribute("demo_mode_write_protect", "0")
if a.chap:
    user, secret = a.chap.split(":", 1)
    tpg.set_attribute("authentication", "1")
    tpg.chap_userid, tpg.chap_password = user, secret
    if a.mutual:
        muser, msecret = a.mutual.split(":", 1)
        tpg.chap_mutual_userid, tpg.chap_mutual_password = muser, msecret
else:
    tpg.set_attribute("authentication", "0")
if a.digest:
    tpg.set_parameter("HeaderDigest", "CRC32C")
    tpg.set_parameter("DataDigest", "CRC32C")
tpg.set_parameter("MaxConnections", str(a.max_connections))
# LIO replaces the negotiated key's local value with the node ACL's default_erl, which a demo-mode
# (generated) ACL takes from the TPG attribute: both must say it.
tpg.set_parameter("ErrorRecoveryLevel", str(a.erl))
tpg.set_attribute("default_erl", str(a.erl))
tpg.enable = True

features = [f"{a.luns} LUN(s) of {a.size} MiB", "ramdisk" if a.ramdisk else "fileio"]
if a.chap:
    features.append("mutual CHAP" if a.mutual else "one-way CHAP")
if a.digest:
    features.append("CRC32C digests required")
features.append(f"MaxConnections={tpg.get_parameter('MaxConnections')}")
features.append(f"ErrorRecoveryLevel={tpg.get_parameter('ErrorRecoveryLevel')}")
features.append(f"default_erl={tpg.get_attribute('default_erl')}")
print(f"LIO serving iscsi://127.0.0.1:{a.port}/{a.iqn}/0 ({', '.join(features)})", flush=True)
