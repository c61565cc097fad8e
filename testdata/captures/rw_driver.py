#!/usr/bin/env python3
"""Small, deterministic READ10/WRITE10 exchange driven through libiscsi (libiscsi.so.7) via ctypes.

The libiscsi command-line tools force HeaderDigest=None,CRC32C and only do large I/O
(iscsi-test-cu's Read10/Write10 tests move tens of MiB), so this driver issues a few
hand-picked commands instead.  Usage:

    rw_driver.py PORTAL TARGET_IQN LUN none|crc32c

Sequence (512-byte blocks):
  1. WRITE10 LBA 0,  8 blocks (4 KiB): fits in immediate data, no R2T
  2. WRITE10 LBA 8, 48 blocks (24 KiB): 8 KiB immediate data, then R2T + Data-Out PDUs
     (tgt: InitialR2T=Yes, ImmediateData=Yes, its MaxRecvDataSegmentLength 8192)
  3. READ10  LBA 0, 56 blocks (28 KiB): Data-In; contents checked against what was written
  4. logout
Data byte at offset i of the LUN is (i * 7 + 3) % 251.
"""
import ctypes
import sys

lib = ctypes.CDLL("libiscsi.so.7")
c_void_p, c_char_p, c_int, c_uint32 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint32


class ScsiIovec(ctypes.Structure):
    _fields_ = [("iov_base", c_void_p), ("iov_len", ctypes.c_size_t)]


lib.iscsi_create_context.restype = c_void_p
lib.iscsi_create_context.argtypes = [c_char_p]
lib.iscsi_get_error.restype = c_char_p
lib.iscsi_get_error.argtypes = [c_void_p]
lib.iscsi_set_targetname.argtypes = [c_void_p, c_char_p]
lib.iscsi_set_session_type.argtypes = [c_void_p, c_int]
lib.iscsi_set_header_digest.argtypes = [c_void_p, c_int]
lib.iscsi_full_connect_sync.argtypes = [c_void_p, c_char_p, c_int]
lib.iscsi_write10_sync.restype = c_void_p
lib.iscsi_write10_sync.argtypes = [c_void_p, c_int, c_uint32, c_char_p, c_uint32, c_int,
                                   c_int, c_int, c_int, c_int, c_int]
lib.iscsi_read10_iov_sync.restype = c_void_p
lib.iscsi_read10_iov_sync.argtypes = [c_void_p, c_int, c_uint32, c_uint32, c_int,
                                      c_int, c_int, c_int, c_int, c_int,
                                      ctypes.POINTER(ScsiIovec), c_int]
lib.scsi_task_get_status.restype = c_int
lib.scsi_task_get_status.argtypes = [c_void_p, c_void_p]
lib.scsi_free_scsi_task.argtypes = [c_void_p]
lib.iscsi_logout_sync.argtypes = [c_void_p]
lib.iscsi_destroy_context.argtypes = [c_void_p]

ISCSI_SESSION_NORMAL = 2
DIGESTS = {"none": 0, "crc32c": 3}  # ISCSI_HEADER_DIGEST_NONE / _CRC32C (offer only that value)
BS = 512


def pattern(offset, length):
    return bytes(((offset + i) * 7 + 3) % 251 for i in range(length))


def die(ctx, what):
    sys.exit(f"rw_driver: {what} failed: {lib.iscsi_get_error(ctx).decode(errors='replace')}")


def check_task(ctx, task, what):
    if not task:
        die(ctx, what)
    status = lib.scsi_task_get_status(task, None)
    lib.scsi_free_scsi_task(task)
    if status != 0:
        sys.exit(f"rw_driver: {what}: SCSI status {status:#x}")


def main():
    portal, iqn, lun, digest = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    ctx = lib.iscsi_create_context(b"iqn.2026-11.test:iscsi-rs-capture-driver")
    if not ctx:
        sys.exit("rw_driver: iscsi_create_context failed")
    lib.iscsi_set_targetname(ctx, iqn.encode())
    lib.iscsi_set_session_type(ctx, ISCSI_SESSION_NORMAL)
    lib.iscsi_set_header_digest(ctx, DIGESTS[digest])
    if lib.iscsi_full_connect_sync(ctx, portal.encode(), lun) != 0:
        die(ctx, "login")

    for lba, blocks in ((0, 8), (8, 48)):
        data = pattern(lba * BS, blocks * BS)
        task = lib.iscsi_write10_sync(ctx, lun, lba, data, len(data), BS, 0, 0, 0, 0, 0)
        check_task(ctx, task, f"WRITE10 lba={lba} blocks={blocks}")

    length = 56 * BS
    buf = ctypes.create_string_buffer(length)
    iov = ScsiIovec(ctypes.cast(buf, c_void_p), length)
    task = lib.iscsi_read10_iov_sync(ctx, lun, 0, length, BS, 0, 0, 0, 0, 0, ctypes.byref(iov), 1)
    check_task(ctx, task, "READ10 lba=0 blocks=56")
    if buf.raw != pattern(0, length):
        sys.exit("rw_driver: READ10 returned data that differs from what was written")

    lib.iscsi_logout_sync(ctx)
    lib.iscsi_destroy_context(ctx)
    print(f"rw_driver: ok (header digest offered: {digest})")


if __name__ == "__main__":
    main()
