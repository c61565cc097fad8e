#!/usr/bin/env python3
"""Writes a pcap of one iSER-over-iWARP connection on 127.0.0.1, built by hand, as test input for
tools/wireshark/iser-iwarp.lua (tests/scripts/iser-capture runs it).

The capture: a TCP handshake; an MPA Request and Reply (revision 2, Enhanced, CRC wanted; private
data = the RFC 6581 IRD/ORD words + the 4-byte iSER CM header 80 00 00 00); then FPDUs (MPA
length, DDP/RDMAP header, payload, pad, CRC32C complemented and stored little-endian):

   I->T  Send                 iSER 0x10 + Login Request (text keys), in two DDP segments (MO != 0)
   T->I  Send                 iSER 0x10 + Login Response
   I->T  Send with SE         iSER 0x14 (RSV, Read STag/TO) + SCSI Command READ(10), 512 bytes
   T->I  RDMA Write           512 bytes to the Read STag/TO
   T->I  Send with SE + Inv   iSER 0x10 + SCSI Response (invalidates the Read STag)
   I->T  Send with SE         iSER 0x18 (WSV, Write STag/TO) + SCSI Command WRITE(10), 512 bytes
   T->I  RDMA Read Request    QN 1: sink STag/TO, size 512, source = the Write STag/TO
   I->T  RDMA Read Response   512 bytes to the sink STag/TO
   T->I  Send with SE         iSER 0x10 + SCSI Response

With --hello, an RFC 5046 Hello and HelloReply (Sends, iSER opcodes 0x2/0x3) come first.
MSNs count per direction and queue from 1. Only the standard library; nothing is sent anywhere.

    tests/scripts/iser-pcap.py [--hello] OUT.pcap [PORT]   (PORT: the target's port, default 34567)
"""
import struct
import sys

# --- CRC32C (Castagnoli, reflected 0x82F63B78), table-driven -------------------------------------
_TABLE = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C

# --- iWARP framing ---------------------------------------------------------------------------------
SEND, SEND_INV, SEND_SE, SEND_SE_INV = 0x3, 0x4, 0x5, 0x6
WRITE, READ_REQ, READ_RESP = 0x0, 0x1, 0x2


def fpdu(ulpdu):
    """An MPA FPDU around a DDP segment: length, segment, pad to 4, CRC32C (little-endian)."""
    body = struct.pack(">H", len(ulpdu)) + ulpdu
    body += b"\0" * (-len(body) % 4)
    return body + struct.pack("<I", crc32c(body))


def control(tagged, last, opcode):
    # T | L | rsvd(4) | DV=01 ; RV=01 | rsvd(2) | opcode(4)
    return bytes([(0x80 if tagged else 0) | (0x40 if last else 0) | 0x01, 0x40 | opcode])


def untagged(opcode, qn, msn, mo, payload, last=True, inval_stag=0):
    return fpdu(control(False, last, opcode) + struct.pack(">IIII", inval_stag, qn, msn, mo) + payload)


def tagged(opcode, stag, to, payload):
    return fpdu(control(True, True, opcode) + struct.pack(">IQ", stag, to) + payload)


def mpa_startup(key, pd):
    # M=0, C=1 (0x4000), Enhanced (0x1000), Rev 2
    return key + struct.pack(">HH", 0x4000 | 0x1000 | 2, len(pd)) + pd


# IRD word, ORD word (RFC 6581: no peer-to-peer flags), then the iSER CM header (ZBVA not used).
MPA_PD = struct.pack(">HH", 16, 16) + bytes([0x80, 0, 0, 0])

# --- iSER and iSCSI --------------------------------------------------------------------------------


def iser(flags, wstag=0, wto=0, rstag=0, rto=0):
    return struct.pack(">B3xIQIQ", flags, wstag, wto, rstag, rto)


def pad4(b):
    return b + b"\0" * (-len(b) % 4)


def bhs(opcode, flags, rest, data=b""):
    """A 48-byte BHS: opcode, flags, bytes 2-3 and 12-47 from REST (a dict of offset: bytes)."""
    h = bytearray(48)
    h[0] = opcode
    h[1] = flags
    h[5:8] = len(data).to_bytes(3, "big")
    for off, val in rest.items():
        h[off:off + len(val)] = val
    return bytes(h) + pad4(data)


ISID = bytes([0x80, 0x12, 0x34, 0x56, 0x00, 0x00])
IQN_T = b"iqn.2026-11.rs.iscsi:target0"
IQN_I = b"iqn.2026-11.rs.iscsi:pcap"
keys = b"".join(k + b"\0" for k in [
    b"InitiatorName=" + IQN_I, b"TargetName=" + IQN_T, b"SessionType=Normal", b"AuthMethod=None",
    b"RDMAExtensions=Yes", b"InitiatorRecvDataSegmentLength=262144",
    b"TargetRecvDataSegmentLength=8192", b"MaxOutstandingUnexpectedPDUs=0", b"HeaderDigest=None",
    b"DataDigest=None", b"ImmediateData=No", b"InitialR2T=Yes"])
u32 = lambda v: struct.pack(">I", v)

# Login Request: I (0x40) | 0x03; T=1, CSG=0 (security), NSG=3 (full feature): 0x83
login_req = bhs(0x43, 0x83, {8: ISID, 16: u32(0x10000000), 20: b"\0\1\0\0", 24: u32(0), 28: u32(0)}, keys)
login_resp = bhs(0x23, 0x83, {8: ISID + b"\0\1", 16: u32(0x10000000), 24: u32(0), 28: u32(1), 32: u32(1)},
                 b"".join(k + b"\0" for k in [b"TargetPortalGroupTag=1", b"RDMAExtensions=Yes",
                                               b"InitiatorRecvDataSegmentLength=262144",
                                               b"TargetRecvDataSegmentLength=8192"]))


def scsi_cmd(flags, itt, cmdsn, edtl, cdb):
    return bhs(0x01, flags, {16: u32(itt), 20: u32(edtl), 24: u32(cmdsn), 28: u32(1), 32: cdb.ljust(16, b"\0")})


def scsi_resp(itt, statsn, expcmdsn):
    return bhs(0x21, 0x80, {16: u32(itt), 24: u32(statsn), 28: u32(expcmdsn), 32: u32(expcmdsn + 127)})


READ10 = bytes([0x28, 0, 0, 0, 0, 0x10, 0, 0, 1, 0])
WRITE10 = bytes([0x2A, 0, 0, 0, 0, 0x20, 0, 0, 1, 0])
R_STAG, R_TO = 0x00001234, 0x00007F0000001000
W_STAG, W_TO = 0x00005678, 0x00007F0000002000
SINK_STAG, SINK_TO = 0x00009ABC, 0x0000550000000000
data_in = bytes(i & 0xFF for i in range(512))
data_out = bytes((i * 7) & 0xFF for i in range(512))

I, T = "I", "T"


def build_script(hello):
    """The FPDUs in order, as (sender, bytes); MSNs count per sender and queue from 1."""
    msns = {}

    def msn(who, qn):
        msns[(who, qn)] = msns.get((who, qn), 0) + 1
        return msns[(who, qn)]

    script = []
    if hello:
        # RFC 5046 Hello / HelloReply: MaxVer|MinVer (CurVer) = 10|10, iSER-IRD / iSER-ORD 16.
        script += [(I, untagged(SEND, 0, msn(I, 0), 0, bytes([0x20, 0xAA, 0, 16]) + bytes(24))),
                   (T, untagged(SEND, 0, msn(T, 0), 0, bytes([0x30, 0xAA, 0, 16]) + bytes(24)))]
    # The login request in two DDP segments of one Send message: the first ends inside the text.
    login_msg = iser(0x10) + login_req
    cut = 28 + 48 + 40
    m = msn(I, 0)
    script += [
        (I, untagged(SEND, 0, m, 0, login_msg[:cut], last=False) + untagged(SEND, 0, m, cut, login_msg[cut:])),
        (T, untagged(SEND, 0, msn(T, 0), 0, iser(0x10) + login_resp)),
        (I, untagged(SEND_SE, 0, msn(I, 0), 0, iser(0x14, rstag=R_STAG, rto=R_TO) + scsi_cmd(0xC1, 1, 1, 512, READ10))),
        (T, tagged(WRITE, R_STAG, R_TO, data_in)),
        (T, untagged(SEND_SE_INV, 0, msn(T, 0), 0, iser(0x10) + scsi_resp(1, 2, 2), inval_stag=R_STAG)),
        (I, untagged(SEND_SE, 0, msn(I, 0), 0, iser(0x18, wstag=W_STAG, wto=W_TO) + scsi_cmd(0xA1, 2, 2, 512, WRITE10))),
        (T, untagged(READ_REQ, 1, msn(T, 1), 0, struct.pack(">IQIIQ", SINK_STAG, SINK_TO, 512, W_STAG, W_TO))),
        (I, tagged(READ_RESP, SINK_STAG, SINK_TO, data_out)),
        (T, untagged(SEND_SE, 0, msn(T, 0), 0, iser(0x10) + scsi_resp(2, 3, 3))),
    ]
    return script


# --- IPv4/TCP on 127.0.0.1 in a pcap (LINKTYPE_RAW) -------------------------------------------------


def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack(">%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


LO = bytes([127, 0, 0, 1])


def packet(sport, dport, seq, ack, flags, payload=b""):
    tcp = struct.pack(">HHIIBBHHH", sport, dport, seq, ack, 5 << 4, flags, 65535, 0, 0) + payload
    pseudo = LO + LO + struct.pack(">BBH", 0, 6, len(tcp))
    tcp = tcp[:16] + struct.pack(">H", csum(pseudo + tcp)) + tcp[18:]
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0x4000, 64, 6, 0, LO, LO)
    ip = ip[:10] + struct.pack(">H", csum(ip)) + ip[12:]
    return ip + tcp


def main():
    args = [a for a in sys.argv[1:] if a != "--hello"]
    out = args[0]
    tport = int(args[1]) if len(args) > 1 else 34567
    iport = 45678
    SYN, ACK, PSH = 0x02, 0x10, 0x08
    seq = {I: 1000, T: 5000}
    ports = {I: (iport, tport), T: (tport, iport)}
    other = {I: T, T: I}
    pkts = [packet(iport, tport, seq[I], 0, SYN), packet(tport, iport, seq[T], seq[I] + 1, SYN | ACK)]
    seq[I] += 1
    seq[T] += 1
    pkts.append(packet(iport, tport, seq[I], seq[T], ACK))

    def send(who, payload):
        pkts.append(packet(*ports[who], seq[who], seq[other[who]], PSH | ACK, payload))
        seq[who] += len(payload)

    send(I, mpa_startup(b"MPA ID Req Frame", MPA_PD))
    send(T, mpa_startup(b"MPA ID Rep Frame", MPA_PD))
    for who, payload in build_script("--hello" in sys.argv):
        send(who, payload)
    with open(out, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 101))
        for n, p in enumerate(pkts):
            f.write(struct.pack("<IIII", 1700000000, n * 1000, len(p), len(p)) + p)


if __name__ == "__main__":
    main()
