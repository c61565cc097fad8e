//! [`Header`]: a PDU's whole header as the decoder hands it over.

use super::ahs::Ahs;
use super::typed::Pdu;

/// A PDU's whole header: the BHS fields, its AHSs and the length of the data
/// segment that follows (RFC 7143 section 11.1).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    /// The BHS fields.
    pub pdu: Pdu,
    /// The Additional Header Segments, in wire order.
    pub ahs: Vec<Ahs>,
    /// DataSegmentLength: bytes of data, without padding.
    pub data_segment_length: u32,
}

impl Header {
    /// A header with no AHS.
    pub fn new(pdu: Pdu, data_segment_length: u32) -> Self {
        Header {
            pdu,
            ahs: Vec::new(),
            data_segment_length,
        }
    }

    /// The full CDB of a SCSI Command: the 16 BHS bytes followed by the
    /// Extended CDB AHS, if any (RFC 7143 sections 11.3.5, 11.2.2.3). `None`
    /// for other PDUs.
    pub fn full_cdb(&self) -> Option<Vec<u8>> {
        let Pdu::ScsiCommand(cmd) = &self.pdu else {
            return None;
        };
        let mut cdb = cmd.cdb.to_vec();
        for ahs in &self.ahs {
            if let Ahs::ExtendedCdb(ext) = ahs {
                cdb.extend_from_slice(ext);
            }
        }
        Some(cdb)
    }

    /// The Bidirectional Expected Read-Data Length AHS value, if present
    /// (RFC 7143 section 11.2.2.4).
    pub fn bidi_expected_read_data_length(&self) -> Option<u32> {
        self.ahs.iter().find_map(|a| match a {
            Ahs::BidiExpectedReadDataLength(n) => Some(*n),
            _ => None,
        })
    }
}
