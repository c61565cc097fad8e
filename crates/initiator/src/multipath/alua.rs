//! What a host reads to follow asymmetric access (SPC-5 5.16) across the
//! paths to one LU, as pure functions over bytes: the Device
//! Identification page (VPD 83h) that says which LU a path reaches and
//! through which target port and group, REPORT TARGET PORT GROUPS that
//! says each group's state, the sense data that says a path may not take
//! a command now, and the rule for which failed commands go again on
//! another path.
//!
//! ```text
//! VPD 83h designation descriptor (SPC-5 7.7.6.1)
//!  0: PROTOCOL IDENTIFIER (7-4) | CODE SET (3-0)
//!  1: PIV (7) | ASSOCIATION (5-4) | DESIGNATOR TYPE (3-0)
//!  2: reserved
//!  3: DESIGNATOR LENGTH (n)
//!  4..4+n: DESIGNATOR
//!
//! REPORT TARGET PORT GROUPS descriptor (SPC-5 6.36.2), after a 4-byte
//! RETURN DATA LENGTH (format 0) or 8-byte extended header (format 1)
//!  0: PREF (7) | ASYMMETRIC ACCESS STATE (3-0)
//!  1: support bits
//!  2..4: TARGET PORT GROUP
//!  7: TARGET PORT COUNT (m), then m 4-byte relative target port entries
//! ```

use crate::command::Sense;
use crate::error::Error;

/// MAINTENANCE IN / REPORT TARGET PORT GROUPS, extended header (format
/// 1), with room for 32 groups of 4 ports each.
pub const RTPG_CDB: [u8; 12] = [0xA3, 0x2A, 0, 0, 0, 0, 0, 0, 0x04, 0, 0, 0];
/// The allocation length [`RTPG_CDB`] asks for.
pub const RTPG_LENGTH: usize = 1024;

/// An asymmetric access state (SPC-5 Table 171), or `Active` for a path to
/// an LU that does not report any (TPGS 0: every path is as good).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Active/optimized.
    Optimized,
    /// Active/non-optimized: it works, slower.
    NonOptimized,
    /// Standby: only status commands until the group moves.
    Standby,
    /// Unavailable: this port cannot serve the LU now.
    Unavailable,
    /// Logical block dependent (rare); treated as non-optimized.
    LbaDependent,
    /// Offline: the port is gone for good until reconfigured.
    Offline,
    /// A move between states is under way: ask again soon.
    Transitioning,
    /// No ALUA: the LU's paths are all alike.
    Active,
}

impl Access {
    /// The state a 4-bit ASYMMETRIC ACCESS STATE code names.
    pub fn from_code(code: u8) -> Access {
        match code & 0x0F {
            0x0 => Access::Optimized,
            0x1 => Access::NonOptimized,
            0x2 => Access::Standby,
            0x3 => Access::Unavailable,
            0x4 => Access::LbaDependent,
            0xE => Access::Offline,
            0xF => Access::Transitioning,
            // Reserved codes: not a state to send I/O to.
            _ => Access::Unavailable,
        }
    }

    /// How much I/O wants this path: higher is better, 0 takes none.
    pub fn preference(self) -> u8 {
        match self {
            Access::Optimized | Access::Active => 3,
            Access::NonOptimized | Access::LbaDependent => 2,
            Access::Standby | Access::Unavailable | Access::Offline | Access::Transitioning => 0,
        }
    }
}

/// Who a path reaches and how: from standard INQUIRY and VPD 83h.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PathIdentity {
    /// The LU's designator (type, bytes): NAA if it has one, else EUI-64,
    /// a SCSI name string or a T10 vendor id. Two paths reach the same LU
    /// exactly when these are equal.
    pub lu: Option<(u8, Vec<u8>)>,
    /// RELATIVE TARGET PORT IDENTIFIER of the port the path goes through.
    pub relative_port: Option<u16>,
    /// TARGET PORT GROUP of that port.
    pub port_group: Option<u16>,
}

/// Designator types in the order an LU's identity is taken from them:
/// NAA (3) is what SPC asks every LU to have and what Linux's multipath
/// matches paths by; EUI-64 (2), SCSI name string (8) and T10 vendor id (1)
/// stand in for targets without one.
const LU_DESIGNATOR_ORDER: [u8; 4] = [3, 2, 8, 1];

/// Reads a Device Identification page (VPD 83h). A page that is short or
/// whose descriptors run past its end is read as far as it holds whole
/// descriptors.
pub fn parse_device_identification(page: &[u8]) -> PathIdentity {
    let mut lu: Option<(u8, Vec<u8>)> = None;
    let mut identity = PathIdentity::default();
    let length = page
        .get(2..4)
        .map_or(0, |b| usize::from(u16::from_be_bytes([b[0], b[1]])));
    let body = page.get(4..).unwrap_or_default();
    let mut rest = &body[..length.min(body.len())];
    while rest.len() >= 4 {
        let association = (rest[1] >> 4) & 0x03;
        let kind = rest[1] & 0x0F;
        let size = usize::from(rest[3]);
        let Some(designator) = rest.get(4..4 + size) else {
            break;
        };
        let port_u16 = || {
            designator
                .get(2..4)
                .map(|b| u16::from_be_bytes([b[0], b[1]]))
        };
        match (association, kind) {
            (0, _) if LU_DESIGNATOR_ORDER.contains(&kind) => {
                let rank = |k: u8| LU_DESIGNATOR_ORDER.iter().position(|&t| t == k);
                if lu.as_ref().is_none_or(|(k, _)| rank(kind) < rank(*k)) {
                    lu = Some((kind, designator.to_vec()));
                }
            }
            (1, 4) => identity.relative_port = port_u16(),
            (1, 5) => identity.port_group = port_u16(),
            _ => {}
        }
        rest = &rest[4 + size..];
    }
    identity.lu = lu;
    identity
}

/// The groups and states a REPORT TARGET PORT GROUPS answer lists: (group,
/// state, its relative target ports). Format 0 and 1 alike (the FORMAT
/// TYPE of byte 4 says which).
pub fn parse_port_groups(data: &[u8]) -> Result<Vec<(u16, Access, Vec<u16>)>, Error> {
    let short = || {
        Error::Protocol(format!(
            "REPORT TARGET PORT GROUPS data of {} bytes",
            data.len()
        ))
    };
    let length = data.get(..4).ok_or_else(short)?;
    let length = u32::from_be_bytes([length[0], length[1], length[2], length[3]]) as usize;
    let extended = data.get(4).is_some_and(|b| (b >> 4) & 0x07 == 1);
    let start = if extended { 8 } else { 4 };
    let end = data.len().min(4usize.saturating_add(length));
    let mut rest = data.get(start..end.max(start)).unwrap_or_default();
    let mut groups = Vec::new();
    while rest.len() >= 8 {
        let count = usize::from(rest[7]);
        let ports: Vec<u16> = rest[8..]
            .chunks_exact(4)
            .take(count)
            .map(|p| u16::from_be_bytes([p[2], p[3]]))
            .collect();
        groups.push((
            u16::from_be_bytes([rest[2], rest[3]]),
            Access::from_code(rest[0]),
            ports,
        ));
        rest = rest.get(8 + 4 * count..).unwrap_or_default();
    }
    Ok(groups)
}

/// The state of the path through relative port `port` in group `group`,
/// from an RTPG answer: its group's state, found by group id or, when the
/// path's VPD gave no group, by the port among a group's ports. A path
/// the answer does not list is unavailable.
pub fn state_of(
    groups: &[(u16, Access, Vec<u16>)],
    group: Option<u16>,
    port: Option<u16>,
) -> Access {
    groups
        .iter()
        .find(|(id, _, ports)| {
            Some(*id) == group || (group.is_none() && port.is_some_and(|p| ports.contains(&p)))
        })
        .map_or(Access::Unavailable, |(_, state, _)| *state)
}

/// How a failed command bears on the path it went through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The LU answered: the same answer would come through any path.
    Answer,
    /// The path's port may not take the command now (NOT READY with a
    /// state of [`Access`]): the command did not run.
    NotHere(Access),
    /// The path broke with the command's outcome unknown (connection lost,
    /// no answer in time, the session gone).
    PathLost,
}

/// Sense key NOT READY and ASC LOGICAL UNIT NOT ACCESSIBLE (04h) with
/// ASCQ 0Ah transitioning, 0Bh standby, 0Ch unavailable (SPC-5 5.16.2.5).
pub fn classify(error: &Error) -> Failure {
    const NOT_READY: u8 = 0x02;
    match error {
        Error::Status {
            sense:
                Some(Sense {
                    key: NOT_READY,
                    asc: 0x04,
                    ascq,
                    ..
                }),
            ..
        } => match ascq {
            0x0A => Failure::NotHere(Access::Transitioning),
            0x0B => Failure::NotHere(Access::Standby),
            0x0C => Failure::NotHere(Access::Unavailable),
            _ => Failure::Answer,
        },
        Error::ConnectionLost
        | Error::Connect { .. }
        | Error::Login(_)
        | Error::ReplacementTimeoutExpired { .. }
        | Error::Datamover(_)
        | Error::Timeout { .. }
        | Error::TargetFailure(_)
        | Error::Aborted(_)
        | Error::Protocol(_)
        | Error::SessionClosed => Failure::PathLost,
        _ => Failure::Answer,
    }
}

/// Which commands go again on another path when theirs broke with the
/// outcome unknown ([`Failure::PathLost`]). A command refused with
/// [`Failure::NotHere`] never ran and goes again whatever it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resend {
    /// Running it twice leaves what running it once does: reads, WRITE,
    /// WRITE SAME, UNMAP, SYNCHRONIZE CACHE, inquiries. A write that may
    /// have landed through a lost path is the same data landing again; it
    /// cannot land *after* its resend through a gateway of a group,
    /// because the survivor fences (blocklists) the old owner before it
    /// takes the LU.
    Idempotent,
    /// Its second run differs from its first: COMPARE AND WRITE (the
    /// compare fails against its own write), PERSISTENT RESERVE OUT
    /// (a second REGISTER with a new key), RESERVE/RELEASE. It fails up
    /// to the caller, which knows what it meant.
    Once,
}

impl Resend {
    /// The class of a CDB by its operation code.
    pub fn of(cdb: &[u8]) -> Resend {
        match cdb.first() {
            // COMPARE AND WRITE, PERSISTENT RESERVE OUT, RESERVE (6/10),
            // RELEASE (6/10), EXTENDED COPY, ORWRITE (16), SANITIZE,
            // FORMAT UNIT, MODE SELECT (6/10).
            Some(
                0x89 | 0x5F | 0x16 | 0x56 | 0x17 | 0x57 | 0x83 | 0x8B | 0x48 | 0x04 | 0x15 | 0x55,
            ) => Resend::Once,
            _ => Resend::Idempotent,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// VPD 83h laid out as `iscsi target` in a gateway group builds it for
    /// port 2 (`device_identification` in `crates/scsi/src/spc.rs`): NAA 6,
    /// relative target port 2, target port group 2, then a SCSI name string
    /// of the target device (association 2, not the LU's).
    #[rustfmt::skip]
    const VPD83: [u8; 56] = [
        0x00, 0x83, 0x00, 0x34,
        0x01, 0x03, 0x00, 0x10, 0x60, 0x01, 0x40, 0x50, 0x00, 0x00, 0x00, 0x00,
        0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0,
        0x51, 0x94, 0x00, 0x04, 0x00, 0x00, 0x00, 0x02,
        0x51, 0x95, 0x00, 0x04, 0x00, 0x00, 0x00, 0x02,
        0x53, 0xa8, 0x00, 0x0c, b'i', b'q', b'n', b'.', b'x', b',', b't', b',',
        b'0', b'x', b'2', 0,
    ];

    #[test]
    fn identity_from_vpd83() {
        let id = parse_device_identification(&VPD83);
        let (kind, naa) = id.lu.clone().unwrap();
        assert_eq!(kind, 3);
        assert_eq!(naa[0] >> 4, 6);
        assert_eq!(naa.len(), 16);
        assert_eq!(id.relative_port, Some(2));
        assert_eq!(id.port_group, Some(2));
        // Cut mid-descriptor: the whole ones before it still count.
        let cut = parse_device_identification(&VPD83[..30]);
        assert!(cut.lu.is_some() && cut.relative_port.is_none());
        // A page length past the data, an empty page, garbage.
        let mut long = VPD83;
        long[3] = 0xff;
        assert_eq!(parse_device_identification(&long), id);
        assert_eq!(parse_device_identification(&[]).lu, None);
        assert_eq!(parse_device_identification(&[0, 0x83, 0, 2, 1]).lu, None);
    }

    #[test]
    fn naa_wins_over_a_name_string_whatever_the_order() {
        #[rustfmt::skip]
        let page = [
            0, 0x83, 0, 16,
            0x53, 0x08, 0, 4, b'n', b'a', b'm', b'e',
            0x01, 0x03, 0, 4, 0x60, 1, 2, 3,
        ];
        assert_eq!(
            parse_device_identification(&page).lu,
            Some((3, vec![0x60, 1, 2, 3]))
        );
    }

    #[test]
    fn port_groups_in_both_formats() {
        // Format 0, as `iscsi target` answers for owner 1 of {1, 2}.
        #[rustfmt::skip]
        let basic = [
            0, 0, 0, 24,
            0x00, 0x8D, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1,
            0x02, 0x8D, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2,
        ];
        let groups = parse_port_groups(&basic).unwrap();
        assert_eq!(
            groups,
            [
                (1, Access::Optimized, vec![1]),
                (2, Access::Standby, vec![2])
            ]
        );
        assert_eq!(state_of(&groups, Some(2), None), Access::Standby);
        assert_eq!(state_of(&groups, None, Some(1)), Access::Optimized);
        assert_eq!(state_of(&groups, Some(9), Some(9)), Access::Unavailable);
        // Format 1 with nobody owning (a takeover under way).
        #[rustfmt::skip]
        let extended = [
            0, 0, 0, 16, 0x10, 10, 0, 0,
            0x0F, 0x8D, 0, 7, 0, 0, 0, 1, 0, 0, 0, 7,
        ];
        assert_eq!(
            parse_port_groups(&extended).unwrap(),
            [(7, Access::Transitioning, vec![7])]
        );
        // Truncated by the allocation length: whole descriptors only.
        assert_eq!(parse_port_groups(&basic[..20]).unwrap().len(), 1);
        assert!(parse_port_groups(&[0, 0]).is_err());
        // A port count past the data ends the list, it does not panic.
        let odd = [0, 0, 0, 8, 0, 0, 0, 3, 0, 0, 0, 200];
        assert_eq!(
            parse_port_groups(&odd).unwrap(),
            [(3, Access::Optimized, vec![])]
        );
    }

    fn check(key: u8, asc: u8, ascq: u8) -> Error {
        Error::Status {
            status: 0x02,
            sense: Sense::parse(&[0x72, key, asc, ascq, 0, 0, 0, 0]),
        }
    }

    #[test]
    fn failures_say_what_the_path_did() {
        assert_eq!(
            classify(&check(2, 4, 0x0B)),
            Failure::NotHere(Access::Standby)
        );
        assert_eq!(
            classify(&check(2, 4, 0x0A)),
            Failure::NotHere(Access::Transitioning)
        );
        assert_eq!(
            classify(&check(2, 4, 0x0C)),
            Failure::NotHere(Access::Unavailable)
        );
        // Other NOT READY and every other sense are the LU's answer.
        assert_eq!(classify(&check(2, 4, 0x02)), Failure::Answer);
        assert_eq!(classify(&check(3, 0x11, 0)), Failure::Answer);
        assert_eq!(classify(&Error::ConnectionLost), Failure::PathLost);
        let refused = Error::Connect {
            address: "127.0.0.1:3260".into(),
            error: std::io::ErrorKind::ConnectionRefused.into(),
        };
        assert_eq!(classify(&refused), Failure::PathLost);
        assert_eq!(
            classify(&Error::InvalidCommand("CDB length")),
            Failure::Answer
        );
    }

    #[test]
    fn only_commands_that_can_run_twice_go_again() {
        assert_eq!(Resend::of(&[0x28]), Resend::Idempotent);
        assert_eq!(Resend::of(&[0x8A]), Resend::Idempotent);
        assert_eq!(Resend::of(&[0x42]), Resend::Idempotent);
        assert_eq!(Resend::of(&[0x89]), Resend::Once);
        assert_eq!(Resend::of(&[0x5F]), Resend::Once);
        assert_eq!(Resend::of(&[0x56]), Resend::Once);
        assert_eq!(Resend::of(&[]), Resend::Idempotent);
    }

    #[test]
    fn states_rank_paths() {
        assert_eq!(Access::from_code(0x80), Access::Optimized);
        assert_eq!(Access::from_code(0x0F), Access::Transitioning);
        assert_eq!(Access::from_code(0x07), Access::Unavailable);
        assert!(Access::Optimized.preference() > Access::NonOptimized.preference());
        assert_eq!(Access::Standby.preference(), 0);
    }
}
