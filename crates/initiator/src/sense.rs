//! Sense data as the initiator reads it: the essentials of a CHECK
//! CONDITION, printed in words through `iscsi-sense`.

use std::fmt;

/// The decoded essentials of sense data (SPC-5 4.4: fixed and descriptor
/// formats).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sense {
    /// SENSE KEY.
    pub key: u8,
    /// ADDITIONAL SENSE CODE.
    pub asc: u8,
    /// ADDITIONAL SENSE CODE QUALIFIER.
    pub ascq: u8,
    /// The raw sense bytes.
    pub raw: Vec<u8>,
}

impl Sense {
    /// Sense key UNIT ATTENTION.
    pub const UNIT_ATTENTION: u8 = 0x06;
    /// Sense key ABORTED COMMAND.
    pub const ABORTED_COMMAND: u8 = 0x0B;
    /// ASC 47h: the transport saw a parity or CRC error (47h/03h
    /// INFORMATION UNIT iuCRC ERROR, 47h/05h PROTOCOL SERVICE CRC ERROR).
    pub const ASC_TRANSPORT_CRC: u8 = 0x47;

    /// Decodes fixed (0x70/0x71) or descriptor (0x72/0x73) sense data;
    /// `None` if too short or of another format.
    pub fn parse(raw: &[u8]) -> Option<Sense> {
        let code = raw.first()? & 0x7f;
        let (key, asc, ascq) = match code {
            0x70 | 0x71 => (raw.get(2)? & 0x0f, *raw.get(12)?, *raw.get(13)?),
            0x72 | 0x73 => (raw.get(1)? & 0x0f, *raw.get(2)?, *raw.get(3)?),
            _ => return None,
        };
        Some(Sense {
            key,
            asc,
            ascq,
            raw: raw.to_vec(),
        })
    }

    /// The sense data as `iscsi-sense` types it, for its words.
    fn typed(&self) -> iscsi_sense::Sense {
        iscsi_sense::Sense::new(
            iscsi_sense::SenseKey::from_code(self.key),
            iscsi_sense::Asc::new(self.asc, self.ascq),
        )
    }
}

/// In words, then the codes: "Illegal Request: Logical unit not supported
/// (ASC 0x25, ASCQ 0x00)", through `iscsi-sense`'s table of T10's names so
/// that initiator and target print sense data the same way.
impl fmt::Display for Sense {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.typed().fmt(f)
    }
}
