#!/usr/bin/env python3
"""Turn one capture (pcapng of iSCSI on 127.0.0.1:PORT) into fixture files.

    analyze.py PORT SCENARIO PCAPNG OUTDIR DESCRIPTION COMMAND...

Writes OUTDIR/SCENARIO.conn<N>.initiator.bin / .target.bin (each direction's TCP payload
stream of TCP connection N, from the connection's first payload byte, as reassembled by
tshark's "follow,tcp,raw"), and OUTDIR/SCENARIO.json (manifest).  Checks, and fails if not:
  * an independent walk of the .bin streams (BHS, AHS, header digest, padded data segment,
    data digest) ends exactly at the end of each stream,
  * it finds the same PDU opcodes, in the same order, as tshark's iSCSI dissector,
  * every CRC32C digest present is correct,
  * tshark reports no malformed packet and no expert info of severity >= warning.
"""
import json
import subprocess
import sys
import xml.etree.ElementTree as ET

OPCODES = {  # RFC 7143 names; the manifest also carries tshark's own names
    0x00: "NOP-Out", 0x01: "SCSI Command", 0x02: "Task Management Function Request",
    0x03: "Login Request", 0x04: "Text Request", 0x05: "SCSI Data-Out", 0x06: "Logout Request",
    0x10: "SNACK Request", 0x1c: "Vendor", 0x20: "NOP-In", 0x21: "SCSI Response",
    0x22: "Task Management Function Response", 0x23: "Login Response", 0x24: "Text Response",
    0x25: "SCSI Data-In", 0x26: "Logout Response", 0x31: "Ready To Transfer (R2T)",
    0x32: "Asynchronous Message", 0x3f: "Reject",
}


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


CRC_TABLE = _table()


def tshark(*args):
    return subprocess.run(["tshark", *args], check=True, capture_output=True, text=True).stdout


def follow_raw(pcap, stream):
    """Return (client_bytes, server_bytes, client_port, server_port) for one TCP stream."""
    out = tshark("-r", pcap, "-q", "-z", f"follow,tcp,raw,{stream}")
    client, server, nodes = [], [], {}
    in_body = False
    for line in out.splitlines():
        if line.startswith("Node 0:") or line.startswith("Node 1:"):
            nodes[line[5]] = int(line.rsplit(":", 1)[1])
            in_body = True
            continue
        if not in_body or line.startswith("====="):
            continue
        if line.startswith("\t"):
            server.append(bytes.fromhex(line.strip()))
        elif line.strip():
            client.append(bytes.fromhex(line.strip()))
    return b"".join(client), b"".join(server), nodes["0"], nodes["1"]


def parse_keys(data):
    keys = {}
    for kv in data.split(b"\0"):
        if b"=" in kv:
            k, v = kv.split(b"=", 1)
            keys[k.decode()] = v.decode()
    return keys


def walk(stream, digests_after, hd, dd):
    """Walk concatenated PDUs.  PDUs with index >= digests_after carry the negotiated digests."""
    pdus, off, idx = [], 0, 0
    while off < len(stream):
        if len(stream) - off < 48:
            raise SystemExit(f"truncated BHS at offset {off}")
        bhs = stream[off:off + 48]
        opcode = bhs[0] & 0x3F
        ahs_len = bhs[4] * 4
        dsl = int.from_bytes(bhs[5:8], "big")
        use = idx >= digests_after
        hlen = 48 + ahs_len
        pos = off + hlen
        pdu = {"index": idx, "offset": off, "opcode": f"0x{opcode:02x}", "rfc_name": OPCODES.get(opcode, "?"),
               "immediate": bool(bhs[0] & 0x40), "final": bool(bhs[1] & 0x80),
               "itt": f"0x{int.from_bytes(bhs[16:20], 'big'):08x}", "ahs_length": ahs_len,
               "data_segment_length": dsl}
        if use and hd:
            got = int.from_bytes(stream[pos:pos + 4], "little")
            if got != crc32c(stream[off:pos]):
                raise SystemExit(f"bad header digest in PDU {idx} at offset {off}")
            pdu["header_digest"] = f"0x{got:08x}"
            pos += 4
        data = stream[pos:pos + dsl]
        pos += (dsl + 3) & ~3
        if use and dd and dsl:
            got = int.from_bytes(stream[pos:pos + 4], "little")
            padded = stream[pos - ((dsl + 3) & ~3):pos]
            if got != crc32c(padded):
                raise SystemExit(f"bad data digest in PDU {idx} at offset {off}")
            pdu["data_digest"] = f"0x{got:08x}"
            pos += 4
        if pos > len(stream):
            raise SystemExit(f"PDU {idx} at offset {off} runs past the end of the stream")
        pdu["length"] = pos - off
        if opcode in (0x03, 0x23, 0x04, 0x24):
            pdu["keys"] = parse_keys(data)
        if opcode in (0x03, 0x23):
            pdu["transit"] = bool(bhs[1] & 0x80)
            pdu["csg"], pdu["nsg"] = (bhs[1] >> 2) & 3, bhs[1] & 3
        if opcode == 0x23:
            pdu["status_class"], pdu["status_detail"] = bhs[36], bhs[37]
        if opcode == 0x01:
            pdu["cdb_opcode"] = f"0x{bhs[32]:02x}"
            pdu["expected_data_transfer_length"] = int.from_bytes(bhs[20:24], "big")
        if opcode in (0x05, 0x25):
            pdu["buffer_offset"] = int.from_bytes(bhs[40:44], "big")
            if opcode == 0x25:
                pdu["status_present"] = bool(bhs[1] & 0x01)
        if opcode == 0x31:
            pdu["buffer_offset"] = int.from_bytes(bhs[40:44], "big")
            pdu["desired_data_transfer_length"] = int.from_bytes(bhs[44:48], "big")
        pdus.append(pdu)
        off, idx = pos, idx + 1
    return pdus


def count_login(stream):
    """(count, byte length) of the leading Login PDUs (no digests on those; digests start right after)."""
    n, off = 0, 0
    while off + 48 <= len(stream) and stream[off] & 0x3F in (0x03, 0x23):
        dsl = int.from_bytes(stream[off + 5:off + 8], "big")
        off += 48 + stream[off + 4] * 4 + ((dsl + 3) & ~3)
        n += 1
    return n, off


def tshark_pdus(pcap, port):
    """Per (stream, srcport): list of (opcode, tshark name) in order, from the PDML."""
    root = ET.fromstring(tshark("-r", pcap, "-d", f"tcp.port=={port},iscsi", "-T", "pdml", "-Y", "iscsi"))
    res = {}
    for pkt in root.iter("packet"):
        stream = sport = None
        for f in pkt.iter("field"):
            if f.get("name") == "tcp.stream" and stream is None:
                stream = int(f.get("show"))
            elif f.get("name") == "tcp.srcport" and sport is None:
                sport = int(f.get("show"))
        for proto in pkt.findall("proto"):
            if proto.get("name") != "iscsi":
                continue
            for f in proto.iter("field"):
                if f.get("name") == "iscsi.opcode":
                    name = f.get("showname").split(":", 1)[1].rsplit("(", 1)[0].strip()
                    res.setdefault((stream, sport), []).append((int(f.get("show"), 16) & 0x3F, name))
                    break
    return res


def check_problems(pcap, port):
    """tshark's malformed/warning frames, split into (iSCSI-level problems, SCSI-payload notes).

    Wireshark's SCSI layer (not iSCSI) throws "Malformed Packet: SCSI" when an INQUIRY VPD page
    is truncated by a short allocation length (Linux asks for the 4-byte page header first);
    such frames are listed as notes, not failures, when they have no other problem."""
    flt = "_ws.malformed || _ws.expert.severity >= warning"
    args = ["-r", pcap, "-d", f"tcp.port=={port},iscsi", "-Y", flt]
    lines = {int(l.split()[0]): l.strip() for l in tshark(*args).strip().splitlines()}
    problems, notes = [], []
    if not lines:
        return problems, notes
    root = ET.fromstring(tshark(*args, "-T", "pdml"))
    for pkt in root.iter("packet"):
        num = int(next(f.get("show") for f in pkt.iter("field") if f.get("name") == "frame.number"))
        malformed = [p.get("showname") for p in pkt.findall("proto") if p.get("name") == "_ws.malformed"]
        iscsi_experts = [f.get("showname") for p in pkt.findall("proto") if p.get("name") == "iscsi"
                         for f in p.iter("field") if f.get("name") == "_ws.expert"]
        bad_digest = [f.get("showname") for f in pkt.iter("field")
                      if f.get("name") in ("iscsi.headerdigest32", "iscsi.datadigest32")
                      and "Good" not in (f.get("showname") or "")]
        if malformed and all(m == "[Malformed Packet: SCSI]" for m in malformed) \
                and not iscsi_experts and not bad_digest:
            notes.append(lines.get(num, str(num)))
        else:
            problems.append(lines.get(num, str(num)))
    return problems, notes


def main():
    port, scenario, pcap, outdir, description = sys.argv[1:6]
    commands = sys.argv[6:]
    port = int(port)
    problems, scsi_payload_notes = check_problems(pcap, port)
    streams = sorted({int(s) for s in tshark("-r", pcap, "-T", "fields", "-e", "tcp.stream",
                                             "-Y", "tcp.len > 0").split()})
    names = tshark_pdus(pcap, port)
    conns = []
    for n, s in enumerate(streams):
        ini, tgt, cport, sport = follow_raw(pcap, s)
        if sport != port:
            raise SystemExit(f"stream {s}: node 1 is port {sport}, expected the target port {port}")
        # Negotiated digests: the last Login Response's answer (RFC 7143: default None).
        n_login, login_len = count_login(tgt)
        logins = walk(tgt[:login_len], 10**9, False, False)
        keys = {}
        for p in logins:
            keys.update(p.get("keys", {}))
        hd, dd = keys.get("HeaderDigest", "None"), keys.get("DataDigest", "None")
        final = logins[-1] if logins else None
        if not final or not (final["transit"] and final["nsg"] == 3 and final["status_class"] == 0):
            raise SystemExit(f"stream {s}: login did not complete")
        i_pdus = walk(ini, count_login(ini)[0], hd == "CRC32C", dd == "CRC32C")
        t_pdus = walk(tgt, n_login, hd == "CRC32C", dd == "CRC32C")
        req_keys = {}
        for p in i_pdus:
            if p["opcode"] == "0x03":
                req_keys.update(p["keys"])
        conn = {"connection": n, "tcp_stream": s, "initiator_port": cport, "target_port": sport,
                "session_type": req_keys.get("SessionType", "Normal"),
                "initiator_name": req_keys.get("InitiatorName"), "target_name": req_keys.get("TargetName"),
                "offered_header_digest": req_keys.get("HeaderDigest"),
                "offered_data_digest": req_keys.get("DataDigest"),
                "header_digest": hd, "data_digest": dd, "login_request_keys": req_keys,
                "login_response_keys": keys}
        for role, data, pdus in (("initiator", ini, i_pdus), ("target", tgt, t_pdus)):
            fname = f"{scenario}.conn{n}.{role}.bin"
            with open(f"{outdir}/{fname}", "wb") as f:
                f.write(data)
            src = cport if role == "initiator" else sport
            ts = names.get((s, src), [])
            if [op for op, _ in ts] != [int(p["opcode"], 16) for p in pdus]:
                raise SystemExit(f"{fname}: tshark PDUs {ts} differ from the stream walk "
                                 f"{[p['opcode'] for p in pdus]}")
            for p, (_, tname) in zip(pdus, ts):
                p["tshark_name"] = tname
            conn[role] = {"file": fname, "bytes": len(data), "pdu_count": len(pdus),
                          "opcodes": [p["tshark_name"] for p in pdus], "pdus": pdus}
        conns.append(conn)
    manifest = {"scenario": scenario, "description": description, "commands": commands,
                "pcapng": f"{scenario}.pcapng", "target_port": port,
                "tshark_problems": problems, "tshark_scsi_payload_notes": scsi_payload_notes,
                "connections": conns}
    with open(f"{outdir}/{scenario}.json", "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    for c in conns:
        print(f"  {scenario} conn{c['connection']} ({c['session_type']}): HeaderDigest={c['header_digest']} "
              f"DataDigest={c['data_digest']}; initiator {c['initiator']['pdu_count']} PDUs/"
              f"{c['initiator']['bytes']} B, target {c['target']['pdu_count']} PDUs/{c['target']['bytes']} B")
    if scsi_payload_notes:
        print(f"  note: {len(scsi_payload_notes)} frames with 'Malformed Packet: SCSI' (truncated INQUIRY VPD "
              "data, Wireshark's SCSI layer; iSCSI framing and digests fine)")
    if problems:
        print("  tshark problems:\n    " + "\n    ".join(problems))
        raise SystemExit(f"{scenario}: tshark reports malformed packets or warnings")


if __name__ == "__main__":
    main()
