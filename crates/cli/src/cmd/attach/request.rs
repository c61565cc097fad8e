//! What a ublk request asks of the LUN, and the device's parameters from
//! the LUN's limits: pure translation, no kernel, so that both are tested
//! on any machine (the host CI has no ublk_drv).

use iscsi_initiator::disk::DiskLimits;

/// The ublk I/O operations we serve (`UBLK_IO_OP_*` of the uapi header).
const OP_READ: u8 = 0;
const OP_WRITE: u8 = 1;
const OP_FLUSH: u8 = 2;
const OP_DISCARD: u8 = 3;
const OP_WRITE_ZEROES: u8 = 5;
/// `UBLK_IO_F_FUA`: the write must be on stable storage when acknowledged.
const F_FUA: u32 = 1 << 13;
/// `UBLK_IO_F_NOUNMAP`: WRITE_ZEROES must not deallocate.
const F_NOUNMAP: u32 = 1 << 15;

/// One request of the block layer, in bytes on the LUN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// READ into the request's buffer.
    Read { offset: u64, len: usize },
    /// WRITE from the request's buffer; `fua` becomes the CDB's FUA bit.
    Write { offset: u64, len: usize, fua: bool },
    /// SYNCHRONIZE CACHE.
    Flush,
    /// UNMAP.
    Discard { offset: u64, len: u64 },
    /// WRITE SAME of zeros (UNMAP bit unless NOUNMAP).
    WriteZeroes {
        offset: u64,
        len: u64,
        may_unmap: bool,
    },
}

impl Request {
    /// The request a ublk I/O descriptor (`op_flags`, `start_sector`,
    /// `nr_sectors`) describes, or `None` for an operation we do not serve
    /// (answered EOPNOTSUPP). Sectors are 512 bytes whatever the LUN's
    /// block size: that is ublk's unit.
    pub fn from_descriptor(op_flags: u32, start_sector: u64, nr_sectors: u32) -> Option<Request> {
        let offset = start_sector << 9;
        let len = u64::from(nr_sectors) << 9;
        Some(match (op_flags & 0xff) as u8 {
            OP_READ => Request::Read {
                offset,
                len: len as usize,
            },
            OP_WRITE => Request::Write {
                offset,
                len: len as usize,
                fua: op_flags & F_FUA != 0,
            },
            OP_FLUSH => Request::Flush,
            OP_DISCARD => Request::Discard { offset, len },
            OP_WRITE_ZEROES => Request::WriteZeroes {
                offset,
                len,
                may_unmap: op_flags & F_NOUNMAP == 0,
            },
            _ => return None,
        })
    }

    /// The bytes the request moves through its buffer (what a success
    /// answers for READ and WRITE; the others answer 0).
    pub fn data_len(&self) -> usize {
        match self {
            Request::Read { len, .. } | Request::Write { len, .. } => *len,
            _ => 0,
        }
    }
}

/// The block device the kernel builds (`struct ublk_params`' basic and
/// discard parts), in plain numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceParams {
    /// log2 of the logical block size.
    pub logical_bs_shift: u8,
    /// log2 of the physical block size.
    pub physical_bs_shift: u8,
    /// log2 of the optimal I/O size (the physical block where the LUN
    /// states no OPTIMAL TRANSFER LENGTH).
    pub io_opt_shift: u8,
    /// Sectors per request: the LUN's maximum transfer.
    pub max_sectors: u32,
    /// Size of the device in sectors.
    pub dev_sectors: u64,
    /// Volatile write cache: the kernel sends FLUSH and FUA.
    pub write_cache: bool,
    /// The device is read-only.
    pub read_only: bool,
    /// Discard limits, when the LUN offers UNMAP.
    pub discard: Option<DiscardParams>,
    /// Sectors per WRITE_ZEROES (0: none).
    pub max_write_zeroes_sectors: u32,
}

/// The discard part of [`DeviceParams`], in bytes and sectors as ublk
/// wants them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiscardParams {
    /// Bytes from the start of the device to the first granule.
    pub alignment: u32,
    /// Bytes per granule.
    pub granularity: u32,
    /// Sectors per discard request.
    pub max_sectors: u32,
    /// Ranges per discard request. Always 1: ublk_drv refuses any other
    /// value ("only support single segment discard", Linux 6.0 to 6.12 at
    /// least); the block layer then sends one range per request, so the
    /// LUN's MAXIMUM UNMAP BLOCK DESCRIPTOR COUNT is not used.
    pub max_segments: u16,
}

impl DeviceParams {
    /// The device for a LUN with `limits`, whose requests are at most
    /// `max_io_bytes` (the ublk I/O buffer).
    pub fn from_limits(limits: &DiskLimits, max_io_bytes: u32) -> DeviceParams {
        let bs = limits.block_size;
        let sectors_per_block = (bs >> 9).max(1);
        let clamp_sectors = |blocks: u64| -> u32 {
            blocks
                .saturating_mul(u64::from(sectors_per_block))
                .min(u64::from(u32::MAX))
                .max(u64::from(sectors_per_block)) as u32
        };
        let log2 = |v: u32| v.max(1).ilog2() as u8;
        let max_sectors = limits.max_transfer.min(max_io_bytes) >> 9;
        let io_opt = limits
            .optimal_transfer
            .filter(|o| o.is_power_of_two())
            .unwrap_or(limits.physical_block_size);
        DeviceParams {
            logical_bs_shift: log2(bs),
            physical_bs_shift: log2(limits.physical_block_size),
            io_opt_shift: log2(io_opt),
            max_sectors,
            dev_sectors: limits.bytes() >> 9,
            write_cache: limits.write_cache,
            read_only: limits.read_only,
            discard: limits.discard.map(|d| DiscardParams {
                alignment: d.alignment.saturating_mul(bs),
                granularity: d.granularity.max(1).saturating_mul(bs),
                max_sectors: clamp_sectors(u64::from(d.max_blocks)),
                max_segments: 1,
            }),
            max_write_zeroes_sectors: clamp_sectors(limits.write_same_blocks)
                .min(max_sectors.max(sectors_per_block) * 64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iscsi_initiator::disk::DiscardLimits;

    fn limits() -> DiskLimits {
        DiskLimits {
            block_size: 4096,
            physical_block_size: 4096,
            blocks: 1 << 20,
            max_transfer: 1 << 20,
            optimal_transfer: None,
            discard: None,
            write_same_blocks: 1 << 16,
            write_cache: false,
            read_only: false,
            unmapped_read_zeros: false,
        }
    }

    #[test]
    fn descriptors_map_to_scsi_requests() {
        assert_eq!(
            Request::from_descriptor(0, 8, 16),
            Some(Request::Read {
                offset: 4096,
                len: 8192
            })
        );
        assert_eq!(
            Request::from_descriptor(1 | F_FUA, 0, 8),
            Some(Request::Write {
                offset: 0,
                len: 4096,
                fua: true
            })
        );
        assert_eq!(Request::from_descriptor(2, 0, 0), Some(Request::Flush));
        assert_eq!(
            Request::from_descriptor(3, 8, 8),
            Some(Request::Discard {
                offset: 4096,
                len: 4096
            })
        );
        assert_eq!(
            Request::from_descriptor(5 | F_NOUNMAP, 0, 8),
            Some(Request::WriteZeroes {
                offset: 0,
                len: 4096,
                may_unmap: false
            })
        );
        assert_eq!(
            Request::from_descriptor(5, 0, 8),
            Some(Request::WriteZeroes {
                offset: 0,
                len: 4096,
                may_unmap: true
            })
        );
        // Zone operations and anything newer: not served.
        assert_eq!(Request::from_descriptor(10, 0, 8), None);
    }

    #[test]
    fn params_follow_the_limits() {
        let p = DeviceParams::from_limits(&limits(), 512 << 10);
        assert_eq!(p.logical_bs_shift, 12);
        assert_eq!(p.physical_bs_shift, 12);
        // The smaller of the LUN's maximum transfer and our buffer.
        assert_eq!(p.max_sectors, 1024);
        assert_eq!(p.dev_sectors, (1u64 << 32) >> 9);
        assert_eq!(p.discard, None);
        assert!(!p.write_cache && !p.read_only);

        let mut l = limits();
        l.block_size = 512;
        l.physical_block_size = 4096;
        l.optimal_transfer = Some(65536);
        l.write_cache = true;
        l.read_only = true;
        l.discard = Some(DiscardLimits {
            max_blocks: 8192,
            max_descriptors: 64,
            granularity: 8,
            alignment: 1,
        });
        let p = DeviceParams::from_limits(&l, 1 << 20);
        assert_eq!((p.logical_bs_shift, p.physical_bs_shift), (9, 12));
        assert_eq!(p.io_opt_shift, 16);
        assert!(p.write_cache && p.read_only);
        assert_eq!(
            p.discard,
            Some(DiscardParams {
                alignment: 512,
                granularity: 4096,
                max_sectors: 8192,
                max_segments: 1
            })
        );
    }
}
