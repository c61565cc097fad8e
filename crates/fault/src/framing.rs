//! Where one PDU ends in a byte stream, and when digests start: the pure
//! part of the proxy, with no I/O.
//!
//! A PDU is BHS (48 bytes), AHS (BHS byte 4, in words), a header digest,
//! the data segment padded to 4 bytes and a data digest when there is data
//! (RFC 7143 section 11.1). Digests are off during login and start with
//! the first PDU after the final Login Response, as HeaderDigest and
//! DataDigest were negotiated (sections 6.3 and 13.1): the proxy reads them
//! off the target's login answers, which hold the outcome of a list
//! negotiation (section 6.2.1).

use crate::spec::Action;
use iscsi_proto::pdu::login::{LoginStage, StatusClass};
use iscsi_proto::pdu::{BHS_LEN, Digests, Pdu, SegmentLengths, padding_len};

/// The length of a CRC32C digest on the wire.
pub const DIGEST_LEN: usize = 4;

/// Where the parts of one PDU lie, from its BHS and the digests in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// BHS, AHS and header digest.
    pub header_len: usize,
    /// The data segment without padding.
    pub data_len: usize,
    /// Padding, and the data digest if there is one.
    pub trailer_len: usize,
}

impl Layout {
    /// The layout of the PDU whose BHS is `bhs`.
    pub fn of(bhs: &[u8; BHS_LEN], digests: Digests) -> Layout {
        let lengths = SegmentLengths {
            total_ahs_words: bhs[4],
            data_segment_length: u32::from_be_bytes([0, bhs[5], bhs[6], bhs[7]]),
        };
        let data_len = lengths.data_segment_length as usize;
        let header_digest = if digests.header { DIGEST_LEN } else { 0 };
        let data_digest = if digests.data && data_len > 0 {
            DIGEST_LEN
        } else {
            0
        };
        Layout {
            header_len: BHS_LEN + lengths.total_ahs_len() + header_digest,
            data_len,
            trailer_len: padding_len(data_len) + data_digest,
        }
    }

    /// The whole PDU's length on the wire.
    pub fn wire_len(&self) -> usize {
        self.header_len + self.data_len + self.trailer_len
    }
}

/// Applies a corrupting action to `wire`, one whole PDU laid out as
/// `layout`: flips every bit of the chosen byte and says which, or `None`
/// if the action corrupts nothing here (another kind of action, or a
/// data byte asked of a PDU without data).
pub fn corrupt(wire: &mut [u8], layout: Layout, action: Action) -> Option<String> {
    let (at, what) = match action {
        Action::CorruptHeader { offset } => {
            let at = offset.unwrap_or(44).min(BHS_LEN - 1);
            (at, format!("BHS byte {at}"))
        }
        Action::CorruptData { offset } => {
            let last = layout.data_len.checked_sub(1)?;
            let at = offset.unwrap_or(layout.data_len / 2).min(last);
            (
                layout.header_len + at,
                format!("data byte {at} of {}", layout.data_len),
            )
        }
        _ => return None,
    };
    let byte = wire.get_mut(at)?;
    let before = *byte;
    *byte = !before;
    Some(format!("flipped {what} ({before:#04x} -> {:#04x})", *byte))
}

/// The most login text kept while waiting for a key's terminating NUL: a
/// key=value pair longer than this (no real one is) is skipped.
const MAX_PENDING_TEXT: usize = 64 * 1024;

/// Follows a connection's login to learn which digests its full feature
/// phase uses.
#[derive(Debug, Default)]
pub struct LoginWatch {
    /// Bytes of the target's login text after the last NUL.
    pending: Vec<u8>,
    /// The digests the target's answers have chosen so far.
    chosen: Digests,
    /// Set by the final Login Response: the digests now in force.
    in_force: Option<Digests>,
}

impl LoginWatch {
    /// The digests PDUs carry now: none until the login is over.
    pub fn digests(&self) -> Digests {
        self.in_force.unwrap_or_default()
    }

    /// Takes note of a PDU from the target with its data segment; true if
    /// it ended the login (digests apply from the next PDU on, both ways).
    pub fn observe_from_target(&mut self, pdu: &Pdu, data: &[u8]) -> bool {
        let Pdu::LoginResponse(response) = pdu else {
            return false;
        };
        if self.in_force.is_some() {
            return false;
        }
        for &byte in data {
            if byte == 0 {
                let pair = std::mem::take(&mut self.pending);
                self.take_pair(&pair);
            } else if self.pending.len() < MAX_PENDING_TEXT {
                self.pending.push(byte);
            }
        }
        let done = response.transit
            && response.next_stage == LoginStage::FullFeaturePhase
            && response.status.status_class() == StatusClass::Success;
        if done {
            self.in_force = Some(self.chosen);
        }
        done
    }

    fn take_pair(&mut self, pair: &[u8]) {
        let Some(at) = pair.iter().position(|&b| b == b'=') else {
            return;
        };
        let (key, value) = (&pair[..at], &pair[at + 1..]);
        let crc = value == b"CRC32C";
        match key {
            b"HeaderDigest" => self.chosen.header = crc,
            b"DataDigest" => self.chosen.data = crc,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iscsi_proto::pdu::LoginResponse;
    use iscsi_proto::pdu::login::LoginStatus;

    fn bhs(ahs_words: u8, data_len: u32) -> [u8; BHS_LEN] {
        let mut bhs = [0u8; BHS_LEN];
        bhs[4] = ahs_words;
        bhs[5..8].copy_from_slice(&data_len.to_be_bytes()[1..]);
        bhs
    }

    #[test]
    fn layout_counts_ahs_padding_and_digests() {
        let none = Digests::default();
        let both = Digests {
            header: true,
            data: true,
        };
        assert_eq!(Layout::of(&bhs(0, 0), none).wire_len(), 48);
        assert_eq!(Layout::of(&bhs(0, 0), both).wire_len(), 52);
        let odd = Layout::of(&bhs(2, 5), both);
        assert_eq!(odd.header_len, 48 + 8 + 4);
        assert_eq!(odd.data_len, 5);
        assert_eq!(odd.trailer_len, 3 + 4);
        assert_eq!(Layout::of(&bhs(0, 0xFF_FFFF), none).data_len, 0xFF_FFFF);
    }

    fn response(transit: bool, stage: LoginStage, class: u8) -> Pdu {
        Pdu::LoginResponse(LoginResponse {
            transit,
            next_stage: stage,
            status: LoginStatus::new(class, 0),
            ..LoginResponse::default()
        })
    }

    #[test]
    fn digests_start_after_the_final_login_response() {
        let mut watch = LoginWatch::default();
        let text = b"HeaderDigest=CRC32C\0DataDi";
        assert!(
            !watch.observe_from_target(&response(false, LoginStage::SecurityNegotiation, 0), text)
        );
        assert_eq!(watch.digests(), Digests::default());
        // The DataDigest pair was split over two PDUs.
        assert!(watch.observe_from_target(
            &response(true, LoginStage::FullFeaturePhase, 0),
            b"gest=CRC32C\0MaxRecvDataSegmentLength=262144\0"
        ));
        assert_eq!(
            watch.digests(),
            Digests {
                header: true,
                data: true
            }
        );
    }

    #[test]
    fn corruption_flips_the_chosen_byte_and_no_other() {
        let digests = Digests {
            header: true,
            data: true,
        };
        let layout = Layout::of(&bhs(0, 10), digests);
        let clean = vec![0x5Au8; layout.wire_len()];
        let mut wire = clean.clone();
        let said = corrupt(&mut wire, layout, Action::CorruptData { offset: None }).unwrap();
        assert_eq!(said, "flipped data byte 5 of 10 (0x5a -> 0xa5)");
        let changed: Vec<usize> = (0..wire.len()).filter(|&i| wire[i] != clean[i]).collect();
        assert_eq!(changed, [52 + 5]);
        let mut wire = clean.clone();
        corrupt(&mut wire, layout, Action::CorruptData { offset: Some(99) }).unwrap();
        assert_ne!(wire[52 + 9], clean[52 + 9], "past the end: the last byte");
        let mut wire = clean.clone();
        corrupt(&mut wire, layout, Action::CorruptHeader { offset: None }).unwrap();
        assert_ne!(wire[44], clean[44]);
        let empty = Layout::of(&bhs(0, 0), digests);
        let mut wire = vec![0u8; empty.wire_len()];
        assert!(corrupt(&mut wire, empty, Action::CorruptData { offset: None }).is_none());
        assert!(corrupt(&mut wire, empty, Action::Drop).is_none());
    }

    #[test]
    fn a_failed_login_turns_nothing_on() {
        let mut watch = LoginWatch::default();
        assert!(!watch.observe_from_target(
            &response(true, LoginStage::FullFeaturePhase, 2),
            b"HeaderDigest=CRC32C\0"
        ));
        assert_eq!(watch.digests(), Digests::default());
        let mut none = LoginWatch::default();
        assert!(none.observe_from_target(
            &response(true, LoginStage::FullFeaturePhase, 0),
            b"HeaderDigest=None\0DataDigest=None\0"
        ));
        assert_eq!(none.digests(), Digests::default());
    }
}
