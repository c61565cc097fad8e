//! Helpers shared by the integration tests.

#![allow(dead_code)]

use std::sync::Arc;

use iscsi_scsi::{
    Backstore, CommandOutcome, Nexus, ScsiTarget, Sense, TargetIdentity, encode_lun, status,
};
use iscsi_stores::RamBackstore;

/// Initiator port `i` (ISID `i`) through target port 1.
pub fn nexus(i: u64) -> Nexus {
    Nexus::iscsi("iqn.2026-01.rs.iscsi:init", i, 1)
}

/// A one-LU target over a RAM disk.
pub fn ram_target(size: u64, bs: u32) -> (ScsiTarget, Arc<RamBackstore>) {
    let store = Arc::new(RamBackstore::new(size, bs, 0x77).unwrap());
    let t = ScsiTarget::new(
        TargetIdentity::new("iqn.2026-01.rs.iscsi:t"),
        vec![Arc::clone(&store) as Arc<dyn Backstore>],
    );
    (t, store)
}

/// A one-LU target over any backstore.
pub fn target_over(store: Arc<dyn Backstore>) -> ScsiTarget {
    ScsiTarget::new(TargetIdentity::new("iqn.2026-01.rs.iscsi:t"), vec![store])
}

pub fn run(t: &ScsiTarget, n: &Nexus, cdb: &[u8], out: &[u8]) -> (CommandOutcome, Vec<u8>) {
    let mut d = vec![0xEE; 5];
    let o = t.execute(n, encode_lun(0), cdb, out, &mut d);
    (o, d)
}

#[track_caller]
pub fn good(t: &ScsiTarget, n: &Nexus, cdb: &[u8], out: &[u8]) -> Vec<u8> {
    let (o, d) = run(t, n, cdb, out);
    assert_eq!(o, CommandOutcome::GOOD, "cdb {cdb:02x?}");
    d
}

#[track_caller]
pub fn check(t: &ScsiTarget, n: &Nexus, cdb: &[u8], out: &[u8], expect: Sense) {
    let (o, d) = run(t, n, cdb, out);
    assert_eq!(o.status, status::CHECK_CONDITION, "cdb {cdb:02x?}");
    assert_eq!(o.sense, Some(expect), "cdb {cdb:02x?}");
    assert!(d.is_empty());
}

#[track_caller]
pub fn conflict(t: &ScsiTarget, n: &Nexus, cdb: &[u8], out: &[u8]) {
    let (o, d) = run(t, n, cdb, out);
    assert_eq!(o, CommandOutcome::RESERVATION_CONFLICT, "cdb {cdb:02x?}");
    assert!(d.is_empty());
}

/// A 16-byte CDB: opcode, byte 1, 8-byte LBA, 4-byte count.
pub fn cdb16(op: u8, b1: u8, lba: u64, n: u32) -> Vec<u8> {
    let mut c = vec![op, b1];
    c.extend_from_slice(&lba.to_be_bytes());
    c.extend_from_slice(&n.to_be_bytes());
    c.extend_from_slice(&[0, 0]);
    c
}

/// A 10-byte CDB: opcode, byte 1, 4-byte LBA, 2-byte count.
pub fn cdb10(op: u8, b1: u8, lba: u32, n: u16) -> Vec<u8> {
    let mut c = vec![op, b1];
    c.extend_from_slice(&lba.to_be_bytes());
    c.push(0);
    c.extend_from_slice(&n.to_be_bytes());
    c.push(0);
    c
}

/// A 12-byte CDB: opcode, byte 1, 4-byte LBA, 4-byte count.
pub fn cdb12(op: u8, b1: u8, lba: u32, n: u32) -> Vec<u8> {
    let mut c = vec![op, b1];
    c.extend_from_slice(&lba.to_be_bytes());
    c.extend_from_slice(&n.to_be_bytes());
    c.extend_from_slice(&[0, 0]);
    c
}

pub fn write16(lba: u64, n: u32) -> Vec<u8> {
    cdb16(0x8A, 0, lba, n)
}

pub fn read16(lba: u64, n: u32) -> Vec<u8> {
    cdb16(0x88, 0, lba, n)
}

/// COMPARE AND WRITE of `n` blocks at `lba`.
pub fn caw(lba: u64, n: u8) -> Vec<u8> {
    let mut c = vec![0x89, 0];
    c.extend_from_slice(&lba.to_be_bytes());
    c.extend_from_slice(&[0, 0, 0, n, 0, 0]);
    c
}

/// GET LBA STATUS from `lba` with allocation length `alloc`.
pub fn get_lba_status(lba: u64, alloc: u32) -> Vec<u8> {
    cdb16(0x9E, 0x12, lba, alloc)
}

/// Decodes GET LBA STATUS data into (lba, blocks, status) descriptors.
pub fn lba_status(d: &[u8]) -> Vec<(u64, u32, u8)> {
    let len = u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize;
    assert_eq!(len + 4, d.len());
    d[8..]
        .chunks_exact(16)
        .map(|c| {
            (
                u64::from_be_bytes(c[0..8].try_into().unwrap()),
                u32::from_be_bytes(c[8..12].try_into().unwrap()),
                c[12] & 0x0F,
            )
        })
        .collect()
}

pub fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

/// A store whose writes and unmaps fail (a dying disk).
#[derive(Debug)]
pub struct Failing(pub RamBackstore);

impl Backstore for Failing {
    fn block_size(&self) -> u32 {
        self.0.block_size()
    }
    fn block_count(&self) -> u64 {
        self.0.block_count()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.0.read_at(offset, buf)
    }
    fn write_at(&self, _: u64, _: &[u8]) -> std::io::Result<()> {
        Err(std::io::Error::other("medium gone"))
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn unmap(&self, _: u64, _: u64) -> std::io::Result<()> {
        Err(std::io::Error::other("medium gone"))
    }
    fn unique_id(&self) -> u64 {
        1
    }
    fn is_thin(&self) -> bool {
        true
    }
    fn can_block_erase(&self) -> bool {
        true
    }
    fn resize(
        &self,
        size: Option<u64>,
        discard: bool,
    ) -> Result<u64, iscsi_scsi::backstore::ResizeError> {
        self.0.resize(size, discard)
    }
}
