//! A SCSI command as the caller submits it and what comes back: status,
//! sense data and residual (RFC 7143 sections 11.3 and 11.4). Read buffers
//! are owned and handed back in the [`Response`], so the connection's
//! reader task lands every Data-In segment straight into them.

use iscsi_proto::pdu::TaskAttribute;

use crate::error::Error;
pub use crate::sense::Sense;

/// SCSI status GOOD (SAM-5).
pub const STATUS_GOOD: u8 = 0x00;
/// SCSI status CHECK CONDITION.
pub const STATUS_CHECK_CONDITION: u8 = 0x02;
/// SCSI status BUSY.
pub const STATUS_BUSY: u8 = 0x08;
/// SCSI status TASK SET FULL.
pub const STATUS_TASK_SET_FULL: u8 = 0x28;

/// The data a command moves.
#[derive(Debug)]
pub enum DataTransfer<'a> {
    /// No data.
    None,
    /// A read: the buffer's length is the Expected Data Transfer Length;
    /// the data lands in it and it comes back in [`Response::data`].
    Read(Vec<u8>),
    /// A read of this many bytes (the Expected Data Transfer Length) into a
    /// buffer of the session's pool, attached when the first Data-In
    /// arrives. It comes back in [`Response::data`], as long as the data
    /// reached (the highest offset received); hand it back with
    /// [`crate::Session::recycle`].
    PooledRead(u32),
    /// A read of this many bytes whose data is received (digests and
    /// offsets checked) and dropped: [`Response::data`] comes back empty,
    /// [`Response::received`] counts the bytes. What a load generator
    /// needs (libiscsi's iscsi-perf lands every read in one shared buffer).
    DiscardedRead(u32),
    /// A write of these bytes.
    Write(&'a [u8]),
    /// A write of these bytes, shared with the session: a transport that
    /// moves the data after the command has gone (iSER, where the target
    /// RDMA Reads it) keeps a reference to them instead of a copy.
    SharedWrite(bytes::Bytes),
}

/// One SCSI command.
#[derive(Debug)]
pub struct Command<'a> {
    /// The LUN number (encoded per SAM: peripheral below 256, flat space up
    /// to 16383).
    pub lun: u64,
    /// The CDB (up to 16 bytes in the BHS; longer CDBs go in an Extended
    /// CDB AHS, RFC 7143 section 11.2.2.3).
    pub cdb: &'a [u8],
    /// The data transfer.
    pub data: DataTransfer<'a>,
    /// The task attribute (SIMPLE by default).
    pub attribute: TaskAttribute,
}

impl<'a> Command<'a> {
    /// A command with no data.
    pub fn new(lun: u64, cdb: &'a [u8]) -> Self {
        Command {
            lun,
            cdb,
            data: DataTransfer::None,
            attribute: TaskAttribute::Simple,
        }
    }

    /// A read into `buffer` (its length is the expected length).
    pub fn read(lun: u64, cdb: &'a [u8], buffer: Vec<u8>) -> Self {
        Command {
            data: DataTransfer::Read(buffer),
            ..Command::new(lun, cdb)
        }
    }

    /// A read of `length` bytes into a buffer from the session's pool (see
    /// [`DataTransfer::PooledRead`]): for callers that consume the data and
    /// recycle the buffer, which keeps the buffers data lands in few and hot
    /// in cache however many reads are in flight.
    pub fn read_pooled(lun: u64, cdb: &'a [u8], length: u32) -> Self {
        Command {
            data: DataTransfer::PooledRead(length),
            ..Command::new(lun, cdb)
        }
    }

    /// A read of `length` bytes whose data is checked and dropped (see
    /// [`DataTransfer::DiscardedRead`]).
    pub fn read_discarded(lun: u64, cdb: &'a [u8], length: u32) -> Self {
        Command {
            data: DataTransfer::DiscardedRead(length),
            ..Command::new(lun, cdb)
        }
    }

    /// A write of `data`.
    pub fn write(lun: u64, cdb: &'a [u8], data: &'a [u8]) -> Self {
        Command {
            data: DataTransfer::Write(data),
            ..Command::new(lun, cdb)
        }
    }

    /// A write of `data`, shared with the session (see
    /// [`DataTransfer::SharedWrite`]): the same as [`Command::write`] over
    /// TCP, one copy fewer over iSER.
    pub fn write_shared(lun: u64, cdb: &'a [u8], data: bytes::Bytes) -> Self {
        Command {
            data: DataTransfer::SharedWrite(data),
            ..Command::new(lun, cdb)
        }
    }
}

/// The residual of a completed command (RFC 7143 section 11.4.5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Residual {
    /// Exactly the expected length moved.
    #[default]
    None,
    /// This many expected bytes were not moved.
    Underflow(u32),
    /// The target had this many more bytes than expected.
    Overflow(u32),
}

/// What a completed command returned.
#[derive(Debug, Default)]
pub struct Response {
    /// The SCSI status byte.
    pub status: u8,
    /// Sense data (raw), if the target sent any.
    pub sense: Vec<u8>,
    /// The residual the target reported (checked against the data that
    /// actually arrived).
    pub residual: Residual,
    /// For a read: the caller's buffer, holding the data received (for a
    /// pooled read, the pool's buffer, as long as the data reached).
    pub data: Vec<u8>,
    /// For a read: bytes of Data-In received.
    pub received: u32,
}

impl Response {
    /// The decoded sense data, if any.
    pub fn sense(&self) -> Option<Sense> {
        Sense::parse(&self.sense)
    }

    /// Whether the same command may simply be sent again: a unit attention
    /// is reported once (after a reset, or to a new I_T nexus such as a
    /// reinstated session, SAM-5 5.14), and a command ended by a CRC error
    /// on the way (ABORTED COMMAND, 47h: the target's answer to a data
    /// digest error at ERL 0, RFC 7143 7.8) never reached the medium.
    pub fn may_retry(&self) -> bool {
        self.status == STATUS_CHECK_CONDITION
            && self.sense().is_some_and(|s| {
                s.key == Sense::UNIT_ATTENTION
                    || (s.key == Sense::ABORTED_COMMAND && s.asc == Sense::ASC_TRANSPORT_CRC)
            })
    }

    /// Whether the target could not take the command now: BUSY or TASK SET
    /// FULL (SAM-5 5.3.1), both asking for it again later. Nothing of it
    /// ran.
    pub fn is_busy(&self) -> bool {
        matches!(self.status, STATUS_BUSY | STATUS_TASK_SET_FULL)
    }

    /// `Ok(self)` for GOOD, else [`Error::Status`].
    pub fn check(self) -> Result<Self, Error> {
        if self.status == STATUS_GOOD {
            Ok(self)
        } else {
            Err(Error::Status {
                status: self.status,
                sense: self.sense(),
            })
        }
    }
}

/// Encodes LUN `n` as the 8-byte LUN field (SAM-5 4.7: peripheral device
/// addressing below 256, flat space addressing up to 16383).
pub fn encode_lun(n: u64) -> u64 {
    if n < 256 {
        n << 48
    } else {
        (0x4000 | (n & 0x3fff)) << 48
    }
}

/// Decodes an 8-byte LUN field in peripheral or flat space addressing;
/// other forms come back as the raw 64-bit value.
pub fn decode_lun(field: u64) -> u64 {
    let b = field.to_be_bytes();
    if field & 0x0000_ffff_ffff_ffff != 0 {
        return field;
    }
    match b[0] >> 6 {
        0b00 => u64::from(b[1]) | (u64::from(b[0]) << 8),
        0b01 => (u64::from(b[0] & 0x3f) << 8) | u64::from(b[1]),
        _ => field,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn luns_round_trip() {
        for n in [0, 1, 255, 256, 16383] {
            assert_eq!(decode_lun(encode_lun(n)), n);
        }
        assert_eq!(encode_lun(1), 0x0001_0000_0000_0000);
        assert_eq!(encode_lun(300), 0x412c_0000_0000_0000);
    }

    #[test]
    fn sense_formats() {
        let mut fixed = vec![0u8; 18];
        fixed[0] = 0x70;
        fixed[2] = 0x05;
        fixed[12] = 0x24;
        let sense = Sense::parse(&fixed).unwrap();
        assert_eq!((sense.key, sense.asc, sense.ascq), (5, 0x24, 0));
        assert_eq!(
            sense.to_string(),
            "Illegal Request: Invalid field in cdb (ASC 0x24, ASCQ 0x00)"
        );
        let descriptor = [0x72, 0x06, 0x29, 0x00, 0, 0, 0, 0];
        assert_eq!(Sense::parse(&descriptor).unwrap().key, 6);
        assert!(Sense::parse(&[0x70, 0]).is_none());
        assert!(Sense::parse(&[]).is_none());
    }
}
