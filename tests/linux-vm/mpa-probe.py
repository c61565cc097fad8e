#!/usr/bin/env python3
"""Sends an MPA Request (RFC 5044 / MPA rev 2, RFC 6581) to an iWARP listener and prints the reply.

Usage: mpa-probe.py HOST PORT [TIMEOUT_S [HOLD_S]]

The request is byte for byte what the Linux kernel's iSER initiator (ib_iser over siw) sends: the
16-byte key "MPA ID Req Frame", flags 0x10 (enhanced: rev 2 IRD/ORD private data; no markers, no CRC
requested), revision 2, private data length 8, private data 00 80 00 01 (IRD 128, ORD 1, no
peer-to-peer RTR) + the iSER CM header 80 00 00 00 (ZBVA not supported). A peer that accepts answers
with "MPA ID Rep Frame", its flags, revision and private data; a peer that refuses sets the R flag
(0x20) in its reply. Exit status: 0 for an accepting MPA Reply, 1 otherwise (refused, closed,
garbage, timeout). HOLD_S (default 0): keep the connection open that long after an accepting reply,
so that the peer sees it established before the close (tgtd logs iser_cm_conn_established only if
the RDMA CM's ESTABLISHED event is handled before the disconnect). Loopback use only: the iSER jobs point it at 127.0.0.1 and a VM forward.
"""
import socket
import sys
import time

REQUEST = b"MPA ID Req Frame" + bytes([0x10, 2, 0, 8, 0x00, 0x80, 0x00, 0x01, 0x80, 0, 0, 0])
REPLY_KEY = b"MPA ID Rep Frame"


def recv_exactly(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 30.0
    hold = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    print(f"mpa-probe: MPA Request to {host}:{port}: {REQUEST.hex(' ')}")
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(REQUEST)
            header = recv_exactly(sock, 20)
            if len(header) < 20:
                print(f"mpa-probe: FAIL: the peer closed after {len(header)} bytes: {header.hex(' ')}")
                return 1
            pd_len = int.from_bytes(header[18:20], "big")
            pd = recv_exactly(sock, pd_len) if pd_len <= 512 else b""
            if header[:16] == REPLY_KEY and not header[16] & 0x20:
                time.sleep(hold)
    except OSError as error:
        print(f"mpa-probe: FAIL: {error}")
        return 1
    key, flags, rev = header[:16], header[16], header[17]
    print(f"mpa-probe: reply key {key!r} flags 0x{flags:02x} rev {rev} pd_len {pd_len} pd {pd.hex(' ')}")
    if key != REPLY_KEY:
        print("mpa-probe: FAIL: not an MPA Reply")
        return 1
    if flags & 0x20:
        print("mpa-probe: FAIL: the peer rejected the connection (R flag)")
        return 1
    if len(pd) >= 4 and flags & 0x10:
        ird = int.from_bytes(pd[0:2], "big") & 0x3FFF
        ord_ = int.from_bytes(pd[2:4], "big") & 0x3FFF
        print(f"mpa-probe: the peer's IRD {ird}, ORD {ord_}; ULP private data {pd[4:].hex(' ') or '(none)'}")
    print("mpa-probe: ok: MPA Reply accepted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
