//! The SCSI helpers of [`Session`]: CDB builders (SPC-5, SBC-4) and the
//! parsers of what comes back. Each helper fails with
//! [`Error::Status`] on a status other than GOOD, after retrying a UNIT
//! ATTENTION (which a target reports once after a reset or reinstatement)
//! and, for a while, BUSY or TASK SET FULL (a target that cannot take the
//! command now, e.g. an RBD gateway rejoining the cluster after a fence).

use std::time::Duration;

use crate::command::{Command, Response, decode_lun};
use crate::error::Error;
use crate::session::Session;

/// How often a command is repeated while it keeps ending in UNIT ATTENTION
/// or a transport CRC error.
const UNIT_ATTENTION_RETRIES: usize = 4;

/// How long a command that keeps ending in BUSY or TASK SET FULL is sent
/// again: past a fenced gateway's 10 s of "again soon", as QEMU's iSCSI
/// driver and Linux's SCSI midlayer send such a command again.
const BUSY_FOR_AT_MOST: Duration = Duration::from_secs(15);
/// The first pause before a BUSY command is sent again; each next one
/// doubles, up to [`BUSY_PAUSE_MAX`].
const BUSY_PAUSE_FIRST: Duration = Duration::from_millis(5);
const BUSY_PAUSE_MAX: Duration = Duration::from_millis(500);

/// Standard INQUIRY data (SPC-5 6.7.2), the parts worth showing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InquiryData {
    /// PERIPHERAL QUALIFIER (3 bits).
    pub peripheral_qualifier: u8,
    /// PERIPHERAL DEVICE TYPE (0 = direct access block device).
    pub device_type: u8,
    /// RMB: removable medium.
    pub removable: bool,
    /// VERSION.
    pub version: u8,
    /// T10 VENDOR IDENTIFICATION, trimmed.
    pub vendor: String,
    /// PRODUCT IDENTIFICATION, trimmed.
    pub product: String,
    /// PRODUCT REVISION LEVEL, trimmed.
    pub revision: String,
    /// TPGS: 0 when the LU reports no asymmetric access; 1 implicit, 2
    /// explicit, 3 both (SPC-5 6.7.2).
    pub tpgs: u8,
}

impl InquiryData {
    /// Parses standard INQUIRY data (at least 36 bytes).
    pub fn parse(data: &[u8]) -> Result<InquiryData, Error> {
        if data.len() < 36 {
            return Err(Error::Protocol(format!(
                "INQUIRY data of {} bytes (36 needed)",
                data.len()
            )));
        }
        let text =
            |range: std::ops::Range<usize>| String::from_utf8_lossy(&data[range]).trim().to_owned();
        Ok(InquiryData {
            peripheral_qualifier: data[0] >> 5,
            device_type: data[0] & 0x1f,
            removable: data[1] & 0x80 != 0,
            version: data[2],
            vendor: text(8..16),
            product: text(16..32),
            revision: text(32..36),
            tpgs: (data[5] >> 4) & 0x03,
        })
    }

    /// A name for the peripheral device type.
    pub fn device_type_name(&self) -> &'static str {
        match self.device_type {
            0x00 => "disk",
            0x01 => "tape",
            0x05 => "cd/dvd",
            0x07 => "optical",
            0x0c => "storage array controller",
            0x0d => "enclosure",
            0x1f => "unknown",
            _ => "other",
        }
    }
}

/// A logical unit's size (READ CAPACITY, SBC-4 5.20 and 5.21).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Number of logical blocks.
    pub blocks: u64,
    /// Bytes per logical block.
    pub block_size: u32,
    /// Thin provisioning enabled (LBPME; READ CAPACITY 16 only).
    pub thin_provisioned: bool,
    /// Unmapped blocks read as zeros (LBPRZ; READ CAPACITY 16 only).
    pub unmapped_read_zeros: bool,
    /// Logical blocks per physical block, as a power of two (LOGICAL
    /// BLOCKS PER PHYSICAL BLOCK EXPONENT; READ CAPACITY 16 only, else 0).
    pub physical_block_exponent: u8,
}

impl Capacity {
    /// The size in bytes.
    pub fn bytes(&self) -> u64 {
        self.blocks.saturating_mul(u64::from(self.block_size))
    }
}

/// INQUIRY (SPC-5 6.7): standard data, or the VPD page `page`.
pub fn inquiry_cdb(vpd_page: Option<u8>, allocation_length: u16) -> [u8; 6] {
    let [hi, lo] = allocation_length.to_be_bytes();
    match vpd_page {
        Some(page) => [0x12, 0x01, page, hi, lo, 0],
        None => [0x12, 0, 0, hi, lo, 0],
    }
}

/// READ (10) or WRITE (10) (SBC-4 5.16, 5.40).
pub fn rw10_cdb(write: bool, lba: u32, blocks: u16) -> [u8; 10] {
    let mut cdb = [0u8; 10];
    cdb[0] = if write { 0x2a } else { 0x28 };
    cdb[2..6].copy_from_slice(&lba.to_be_bytes());
    cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
    cdb
}

/// READ (16) or WRITE (16) (SBC-4 5.18, 5.42).
pub fn rw16_cdb(write: bool, lba: u64, blocks: u32) -> [u8; 16] {
    let mut cdb = [0u8; 16];
    cdb[0] = if write { 0x8a } else { 0x88 };
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
    cdb
}

impl Session {
    /// Runs `command` built by `make` until it is not a UNIT ATTENTION,
    /// then requires GOOD.
    pub(crate) async fn run_checked<'a>(
        &self,
        mut make: impl FnMut(Vec<u8>) -> Command<'a>,
        mut buffer: Vec<u8>,
    ) -> Result<Response, Error> {
        let mut retried = 0;
        let mut busy: Option<(tokio::time::Instant, Duration)> = None;
        loop {
            let response = self.execute(make(buffer)).await?;
            if response.is_busy() {
                let (since, pause) =
                    busy.get_or_insert((tokio::time::Instant::now(), BUSY_PAUSE_FIRST));
                if since.elapsed() >= BUSY_FOR_AT_MOST {
                    return response.check();
                }
                tokio::time::sleep(*pause).await;
                *pause = (*pause * 2).min(BUSY_PAUSE_MAX);
            } else if !response.may_retry() || retried == UNIT_ATTENTION_RETRIES {
                return response.check();
            } else {
                retried += 1;
            }
            buffer = response.data;
        }
    }

    /// Runs a command that moves no data, to GOOD.
    async fn no_data(&self, lun: u64, cdb: &[u8]) -> Result<(), Error> {
        self.run_checked(|_| Command::new(lun, cdb), Vec::new())
            .await
            .map(drop)
    }

    /// TEST UNIT READY (SPC-5 6.47).
    pub async fn test_unit_ready(&self, lun: u64) -> Result<(), Error> {
        self.no_data(lun, &[0u8; 6]).await
    }

    /// Standard INQUIRY data.
    pub async fn inquiry(&self, lun: u64) -> Result<InquiryData, Error> {
        let cdb = inquiry_cdb(None, 96);
        let response = self
            .run_checked(|b| Command::read(lun, &cdb, b), vec![0; 96])
            .await?;
        InquiryData::parse(&response.data[..response.received as usize])
    }

    /// A VPD page (INQUIRY with EVPD), as returned.
    pub async fn inquiry_vpd(&self, lun: u64, page: u8) -> Result<Vec<u8>, Error> {
        let cdb = inquiry_cdb(Some(page), 255);
        let response = self
            .run_checked(|b| Command::read(lun, &cdb, b), vec![0; 255])
            .await?;
        let mut data = response.data;
        data.truncate(response.received as usize);
        Ok(data)
    }

    /// REPORT TARGET PORT GROUPS (SPC-5 6.36), extended header: the
    /// answer as returned (see `multipath::alua::parse_port_groups`).
    pub async fn report_target_port_groups(&self, lun: u64) -> Result<Vec<u8>, Error> {
        use crate::multipath::alua::{RTPG_CDB, RTPG_LENGTH};
        let response = self
            .run_checked(|b| Command::read(lun, &RTPG_CDB, b), vec![0; RTPG_LENGTH])
            .await?;
        let mut data = response.data;
        data.truncate(response.received as usize);
        Ok(data)
    }

    /// READ CAPACITY (10) (SBC-4 5.20).
    pub async fn read_capacity10(&self, lun: u64) -> Result<Capacity, Error> {
        let cdb = [0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let response = self
            .run_checked(|b| Command::read(lun, &cdb, b), vec![0; 8])
            .await?;
        let d = &response.data;
        if response.received < 8 {
            return Err(Error::Protocol("short READ CAPACITY (10) data".into()));
        }
        let last = u32::from_be_bytes([d[0], d[1], d[2], d[3]]);
        Ok(Capacity {
            blocks: u64::from(last) + 1,
            block_size: u32::from_be_bytes([d[4], d[5], d[6], d[7]]),
            thin_provisioned: false,
            unmapped_read_zeros: false,
            physical_block_exponent: 0,
        })
    }

    /// READ CAPACITY (16) (SBC-4 5.21; SERVICE ACTION IN (16)).
    pub async fn read_capacity16(&self, lun: u64) -> Result<Capacity, Error> {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x9e;
        cdb[1] = 0x10;
        cdb[13] = 32;
        let response = self
            .run_checked(|b| Command::read(lun, &cdb, b), vec![0; 32])
            .await?;
        let d = &response.data;
        if response.received < 12 {
            return Err(Error::Protocol("short READ CAPACITY (16) data".into()));
        }
        let last = u64::from_be_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]);
        Ok(Capacity {
            blocks: last.saturating_add(1),
            block_size: u32::from_be_bytes([d[8], d[9], d[10], d[11]]),
            thin_provisioned: response.received > 14 && d[14] & 0x80 != 0,
            unmapped_read_zeros: response.received > 14 && d[14] & 0x40 != 0,
            physical_block_exponent: if response.received > 13 {
                d[13] & 0x0f
            } else {
                0
            },
        })
    }

    /// The capacity: READ CAPACITY (16), or (10) if the target does not
    /// support 16.
    pub async fn read_capacity(&self, lun: u64) -> Result<Capacity, Error> {
        match self.read_capacity16(lun).await {
            Ok(capacity) => Ok(capacity),
            Err(Error::Status { .. }) => self.read_capacity10(lun).await,
            Err(other) => Err(other),
        }
    }

    /// Reads `buffer.len() / block_size` blocks from `lba` into `buffer`
    /// and returns it: READ (10) when LBA and length fit, else READ (16).
    pub async fn read(
        &self,
        lun: u64,
        lba: u64,
        block_size: u32,
        buffer: Vec<u8>,
    ) -> Result<Vec<u8>, Error> {
        let blocks = blocks_of(buffer.len(), block_size)?;
        let response = match (u32::try_from(lba), u16::try_from(blocks)) {
            (Ok(lba32), Ok(blocks16))
                if u64::from(lba32) + u64::from(blocks16) <= u64::from(u32::MAX) =>
            {
                let cdb = rw10_cdb(false, lba32, blocks16);
                self.run_checked(|b| Command::read(lun, &cdb, b), buffer)
                    .await?
            }
            _ => {
                let cdb = rw16_cdb(false, lba, blocks);
                self.run_checked(|b| Command::read(lun, &cdb, b), buffer)
                    .await?
            }
        };
        Ok(response.data)
    }

    /// Writes `data` (whole blocks) at `lba`: WRITE (10) when LBA and
    /// length fit, else WRITE (16).
    pub async fn write(
        &self,
        lun: u64,
        lba: u64,
        block_size: u32,
        data: &[u8],
    ) -> Result<(), Error> {
        self.write_with(lun, lba, block_size, data, false).await
    }

    /// Writes `data` as [`Session::write`] does, with FUA (SBC-4 5.40): the
    /// target answers only once the data is on stable storage, so a write
    /// acknowledged this way survives a crash of the target.
    pub async fn write_fua(
        &self,
        lun: u64,
        lba: u64,
        block_size: u32,
        data: &[u8],
    ) -> Result<(), Error> {
        self.write_with(lun, lba, block_size, data, true).await
    }

    async fn write_with(
        &self,
        lun: u64,
        lba: u64,
        block_size: u32,
        data: &[u8],
        fua: bool,
    ) -> Result<(), Error> {
        const FUA: u8 = 0x08;
        let blocks = blocks_of(data.len(), block_size)?;
        let (mut cdb10, mut cdb16);
        let cdb: &mut [u8] = match (u32::try_from(lba), u16::try_from(blocks)) {
            (Ok(lba32), Ok(blocks16))
                if u64::from(lba32) + u64::from(blocks16) <= u64::from(u32::MAX) =>
            {
                cdb10 = rw10_cdb(true, lba32, blocks16);
                &mut cdb10
            }
            _ => {
                cdb16 = rw16_cdb(true, lba, blocks);
                &mut cdb16
            }
        };
        if fua {
            cdb[1] |= FUA;
        }
        let cdb: &[u8] = cdb;
        self.run_checked(|_| Command::write(lun, cdb, data), Vec::new())
            .await
            .map(drop)
    }

    /// READ (16) of `buffer.len() / block_size` blocks.
    pub async fn read16(
        &self,
        lun: u64,
        lba: u64,
        block_size: u32,
        buffer: Vec<u8>,
    ) -> Result<Vec<u8>, Error> {
        let cdb = rw16_cdb(false, lba, blocks_of(buffer.len(), block_size)?);
        Ok(self
            .run_checked(|b| Command::read(lun, &cdb, b), buffer)
            .await?
            .data)
    }

    /// WRITE (16) of `data`.
    pub async fn write16(
        &self,
        lun: u64,
        lba: u64,
        block_size: u32,
        data: &[u8],
    ) -> Result<(), Error> {
        let cdb = rw16_cdb(true, lba, blocks_of(data.len(), block_size)?);
        self.run_checked(|_| Command::write(lun, &cdb, data), Vec::new())
            .await
            .map(drop)
    }

    /// SYNCHRONIZE CACHE (10) of the whole LUN (SBC-4 5.30).
    pub async fn synchronize_cache(&self, lun: u64) -> Result<(), Error> {
        self.no_data(lun, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0]).await
    }

    /// RESERVE (10) of the whole LUN for this I_T nexus (SPC-2 7.21): other
    /// nexuses get RESERVATION CONFLICT until it is released, or the nexus
    /// is lost (the session ends) or the LUN reset.
    pub async fn reserve(&self, lun: u64) -> Result<(), Error> {
        self.no_data(lun, &[0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0]).await
    }

    /// RELEASE (10) of a reservation this nexus holds (SPC-2 7.17).
    pub async fn release(&self, lun: u64) -> Result<(), Error> {
        self.no_data(lun, &[0x57, 0, 0, 0, 0, 0, 0, 0, 0, 0]).await
    }

    /// UNMAP these `(lba, blocks)` ranges (SBC-4 5.37).
    pub async fn unmap(&self, lun: u64, ranges: &[(u64, u32)]) -> Result<(), Error> {
        let descriptors = ranges.len() * 16;
        let total = 8 + descriptors;
        let length =
            u16::try_from(total).map_err(|_| Error::InvalidCommand("too many UNMAP ranges"))?;
        let mut list = Vec::with_capacity(total);
        list.extend_from_slice(&(length - 2).to_be_bytes());
        list.extend_from_slice(&(descriptors as u16).to_be_bytes());
        list.extend_from_slice(&[0; 4]);
        for &(lba, blocks) in ranges {
            list.extend_from_slice(&lba.to_be_bytes());
            list.extend_from_slice(&blocks.to_be_bytes());
            list.extend_from_slice(&[0; 4]);
        }
        let [hi, lo] = length.to_be_bytes();
        let cdb = [0x42, 0, 0, 0, 0, 0, 0, hi, lo, 0];
        self.run_checked(|_| Command::write(lun, &cdb, &list), Vec::new())
            .await
            .map(drop)
    }

    /// REPORT LUNS (SPC-5 6.29): the LUN numbers.
    pub async fn report_luns(&self) -> Result<Vec<u64>, Error> {
        let mut allocation = 4096u32;
        loop {
            let mut cdb = [0u8; 12];
            cdb[0] = 0xa0;
            cdb[6..10].copy_from_slice(&allocation.to_be_bytes());
            let response = self
                .run_checked(|b| Command::read(0, &cdb, b), vec![0; allocation as usize])
                .await?;
            let data = &response.data[..response.received as usize];
            if data.len() < 8 {
                return Err(Error::Protocol("short REPORT LUNS data".into()));
            }
            let list_length = u32::from_be_bytes([data[0], data[1], data[2], data[3]]);
            if list_length + 8 > allocation && allocation < 1 << 20 {
                allocation = (list_length + 8).min(1 << 20);
                continue;
            }
            return Ok(data[8..]
                .chunks_exact(8)
                .take(list_length as usize / 8)
                .map(|e| {
                    decode_lun(u64::from_be_bytes([
                        e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7],
                    ]))
                })
                .collect());
        }
    }
}

fn blocks_of(bytes: usize, block_size: u32) -> Result<u32, Error> {
    if block_size == 0 || !bytes.is_multiple_of(block_size as usize) {
        return Err(Error::InvalidCommand(
            "length is not a whole number of blocks",
        ));
    }
    u32::try_from(bytes / block_size as usize).map_err(|_| Error::InvalidCommand("too many blocks"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdbs() {
        assert_eq!(
            rw10_cdb(false, 0x01020304, 8),
            [0x28, 0, 1, 2, 3, 4, 0, 0, 8, 0]
        );
        let w16 = rw16_cdb(true, 1 << 33, 2);
        assert_eq!(w16[0], 0x8a);
        assert_eq!(&w16[2..10], &(1u64 << 33).to_be_bytes());
        assert_eq!(&w16[10..14], &2u32.to_be_bytes());
        assert_eq!(inquiry_cdb(Some(0x80), 255), [0x12, 1, 0x80, 0, 255, 0]);
    }

    #[test]
    fn inquiry_parse() {
        let mut data = vec![0u8; 36];
        data[8..16].copy_from_slice(b"LIO-ORG ");
        data[16..32].copy_from_slice(b"ramdisk         ");
        data[32..36].copy_from_slice(b"4.0 ");
        let parsed = InquiryData::parse(&data).unwrap();
        assert_eq!(
            (parsed.vendor.as_str(), parsed.product.as_str()),
            ("LIO-ORG", "ramdisk")
        );
        assert_eq!(parsed.device_type_name(), "disk");
        assert!(InquiryData::parse(&data[..20]).is_err());
    }

    #[test]
    fn whole_blocks() {
        assert_eq!(blocks_of(4096, 512).unwrap(), 8);
        assert!(blocks_of(100, 512).is_err());
        assert!(blocks_of(512, 0).is_err());
    }
}
