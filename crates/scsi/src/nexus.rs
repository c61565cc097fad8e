//! I_T nexuses (SAM-5 §4.6.2) and iSCSI TransportIDs (SPC-4 §7.6.4.6).
//!
//! Every command arrives through one I_T nexus: an initiator port (for
//! iSCSI, the initiator name plus the session's ISID) talking to a target
//! port. Reservations, registrations and unit attentions are kept per
//! nexus.

use iscsi_sense::Sense;

/// iSCSI's PROTOCOL IDENTIFIER (SPC-4 Table 362).
pub const PROTOCOL_ID_ISCSI: u8 = 0x5;

/// One I_T nexus: who sent a command and through which target port.
///
/// Two nexuses are the same when their initiator ports match (ASCII
/// case-insensitively: iSCSI names are case-folded, RFC 3722) and their
/// target ports match; [`Nexus::key`] is that identity.
///
/// The key is made once, when the nexus is: every command looks its nexus
/// up (unit attentions, reservations, the set of known nexuses), and a
/// lower-cased copy of the name per command was an allocation on the I/O
/// path of every core.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Nexus {
    /// The initiator port name: for iSCSI `"<initiator name>,i,0x<ISID>"`
    /// with the ISID as 12 hex digits (RFC 7143 §4.2.7.2).
    pub(crate) initiator_port: String,
    /// The relative target port identifier (SPC-4 §3.1.121; 1 for the first
    /// target portal group).
    pub(crate) target_port: u16,
    /// The initiator's TransportID, reported by PERSISTENT RESERVE IN READ
    /// FULL STATUS: for iSCSI the initiator port format (format code 01b,
    /// SPC-4 §7.6.4.6), as [`iscsi_transport_id`] builds it.
    pub(crate) transport_id: Vec<u8>,
    key: NexusKey,
}

/// The identity of a [`Nexus`]: its lower-cased initiator port and its
/// relative target port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NexusKey {
    initiator_port: String,
    target_port: u16,
}

impl NexusKey {
    /// The identity of initiator port `initiator_port` through relative
    /// target port `target_port` (a stored reservation's holder).
    pub(crate) fn new(initiator_port: &str, target_port: u16) -> Self {
        Self {
            initiator_port: initiator_port.to_ascii_lowercase(),
            target_port,
        }
    }

    /// The initiator port name, lower-cased.
    pub fn initiator_port(&self) -> &str {
        &self.initiator_port
    }

    /// The relative target port identifier.
    pub fn target_port(&self) -> u16 {
        self.target_port
    }
}

impl Nexus {
    /// The nexus of an iSCSI session: initiator `initiator_name` with the
    /// session's 48-bit `isid` (the low 48 bits are used), through relative
    /// target port `target_port`.
    pub fn iscsi(initiator_name: &str, isid: u64, target_port: u16) -> Self {
        let initiator_port = format!(
            "{},i,0x{:012x}",
            initiator_name.to_ascii_lowercase(),
            isid & 0xFFFF_FFFF_FFFF
        );
        let transport_id = iscsi_transport_id(&initiator_port);
        Self::new(initiator_port, target_port, transport_id)
    }

    /// A nexus from its parts (a PERSISTENT RESERVE OUT's TransportID).
    pub(crate) fn new(initiator_port: String, target_port: u16, transport_id: Vec<u8>) -> Self {
        let key = NexusKey {
            initiator_port: initiator_port.to_ascii_lowercase(),
            target_port,
        };
        Self {
            initiator_port,
            target_port,
            transport_id,
            key,
        }
    }

    /// This nexus's identity.
    pub fn key(&self) -> &NexusKey {
        &self.key
    }

    /// The initiator port name.
    pub fn initiator_port(&self) -> &str {
        &self.initiator_port
    }

    /// The relative target port identifier.
    pub fn target_port(&self) -> u16 {
        self.target_port
    }

    /// The initiator's TransportID.
    pub fn transport_id(&self) -> &[u8] {
        &self.transport_id
    }
}

/// An iSCSI TransportID in initiator port format (SPC-4 §7.6.4.6, format
/// code 01b): byte 0 `0x45`, ADDITIONAL LENGTH in bytes 2-3, then
/// `initiator_port` NUL-terminated and zero-padded to a multiple of 4 (at
/// least 20 bytes).
pub fn iscsi_transport_id(initiator_port: &str) -> Vec<u8> {
    let mut name: Vec<u8> = initiator_port.bytes().filter(|&b| b != 0).collect();
    // The whole TransportID must fit the 16-bit length with room to spare.
    name.truncate(0xFF00);
    name.push(0);
    while name.len() < 20 || !name.len().is_multiple_of(4) {
        name.push(0);
    }
    let len = u16::try_from(name.len()).unwrap_or(u16::MAX);
    let mut v = vec![0x40 | PROTOCOL_ID_ISCSI, 0];
    v.extend_from_slice(&len.to_be_bytes());
    v.extend_from_slice(&name);
    v
}

/// Parses an iSCSI TransportID in initiator port format at the start of
/// `bytes` and returns the initiator port name it designates (lower-cased)
/// and the TransportID's total length. Anything else (other protocols, the
/// device-name format 00b, a malformed name) is INVALID FIELD IN PARAMETER
/// LIST.
pub fn parse_iscsi_transport_id(bytes: &[u8]) -> Result<(String, usize), Sense> {
    let bad = Sense::INVALID_FIELD_IN_PARAMETER_LIST;
    let head = bytes.get(..4).ok_or(bad)?;
    if head[0] != (0x40 | PROTOCOL_ID_ISCSI) {
        return Err(bad);
    }
    let len = usize::from(u16::from_be_bytes([head[2], head[3]]));
    let total = len.checked_add(4).ok_or(bad)?;
    let body = bytes.get(4..total).ok_or(bad)?;
    let end = body.iter().position(|&b| b == 0).unwrap_or(body.len());
    let name = std::str::from_utf8(body.get(..end).ok_or(bad)?).map_err(|_| bad)?;
    let lower = name.to_ascii_lowercase();
    let Some((initiator, isid)) = lower.split_once(",i,0x") else {
        return Err(bad);
    };
    if initiator.is_empty() || isid.is_empty() || !isid.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad);
    }
    Ok((lower, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_id_round_trip() {
        let n = Nexus::iscsi("iqn.2026-01.rs.iscsi:Init", 0x0002_3D00_0001, 1);
        assert_eq!(
            n.initiator_port,
            "iqn.2026-01.rs.iscsi:init,i,0x00023d000001"
        );
        assert_eq!(n.transport_id[0], 0x45);
        assert_eq!(n.transport_id.len() % 4, 0);
        let (port, len) = parse_iscsi_transport_id(&n.transport_id).unwrap();
        assert_eq!(port, n.initiator_port);
        assert_eq!(len, n.transport_id.len());
        assert!(parse_iscsi_transport_id(&[0x05, 0, 0, 4, b'a', 0, 0, 0]).is_err());
        assert!(parse_iscsi_transport_id(&[0x45, 0, 0xFF, 0xFF]).is_err());
        assert!(parse_iscsi_transport_id(&[]).is_err());
    }
}
