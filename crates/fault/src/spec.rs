//! What a fault is, and its text form `ACTION[=ARG]@WHERE[#N|%N]`.
//!
//! - ACTION: `corrupt-header[=BYTE]`, `corrupt-data[=BYTE]`, `drop`,
//!   `delay=DURATION`, `stall=DURATION`, `cut`, `cut-after=BYTES`.
//! - WHERE: a PDU kind (`data-in`, `data-out`, `scsi-command`, `r2t`, ...,
//!   see [`PduKind::NAMES`]), a direction (`to-target`, `to-initiator`) or
//!   `any`.
//! - `#N` fires once, at the Nth PDU that matches (the default is `#1`);
//!   `%N` fires at every Nth. PDUs are counted over the proxy's whole life,
//!   across connections, so that a fault that ends a connection does not
//!   fire again on the connection that replaces it.
//!
//! `cut-after=BYTES@to-target` forwards exactly BYTES bytes of a connection
//! in that direction, wherever that falls inside a PDU, then cuts it; it
//! fires once.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use iscsi_proto::pdu::Opcode;

/// Which way a PDU travels through the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Direction {
    /// From the initiator (the proxy's client) to the target.
    ToTarget,
    /// From the target back to the initiator.
    ToInitiator,
}

impl Direction {
    /// The name used in fault specifications and logs.
    pub const fn name(self) -> &'static str {
        match self {
            Direction::ToTarget => "to-target",
            Direction::ToInitiator => "to-initiator",
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A PDU kind by the name a fault specification uses for its opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PduKind(pub Opcode);

impl PduKind {
    /// Every name, with its opcode (RFC 7143 section 11.2.1.2).
    pub const NAMES: [(&'static str, Opcode); 18] = [
        ("nop-out", Opcode::NopOut),
        ("scsi-command", Opcode::ScsiCommand),
        ("task-request", Opcode::TaskManagementRequest),
        ("login-request", Opcode::LoginRequest),
        ("text-request", Opcode::TextRequest),
        ("data-out", Opcode::ScsiDataOut),
        ("logout-request", Opcode::LogoutRequest),
        ("snack", Opcode::SnackRequest),
        ("nop-in", Opcode::NopIn),
        ("scsi-response", Opcode::ScsiResponse),
        ("task-response", Opcode::TaskManagementResponse),
        ("login-response", Opcode::LoginResponse),
        ("text-response", Opcode::TextResponse),
        ("data-in", Opcode::ScsiDataIn),
        ("logout-response", Opcode::LogoutResponse),
        ("r2t", Opcode::ReadyToTransfer),
        ("async", Opcode::AsyncMessage),
        ("reject", Opcode::Reject),
    ];

    /// The name of `opcode`, or `opcode-0xNN` for one without a name.
    pub fn name_of(opcode: Opcode) -> String {
        Self::NAMES
            .iter()
            .find(|(_, named)| *named == opcode)
            .map(|(name, _)| (*name).to_owned())
            .unwrap_or_else(|| format!("opcode-{:#04x}", opcode.to_bits()))
    }
}

/// Which PDUs (or bytes) a fault looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Matcher {
    /// PDUs with this opcode.
    Kind(PduKind),
    /// Every PDU travelling this way.
    Direction(Direction),
    /// Every PDU.
    Any,
}

impl Matcher {
    /// Whether a PDU with `opcode` travelling `direction` matches.
    pub fn matches(self, direction: Direction, opcode: Opcode) -> bool {
        match self {
            Matcher::Kind(kind) => kind.0 == opcode,
            Matcher::Direction(wanted) => wanted == direction,
            Matcher::Any => true,
        }
    }
}

/// When a fault fires among the PDUs its matcher accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Occurrence {
    /// Once, at the Nth match (1-based).
    Nth(u64),
    /// At every Nth match.
    Every(u64),
}

impl Occurrence {
    /// Whether the `count`th match (1-based) fires.
    pub fn fires_at(self, count: u64) -> bool {
        match self {
            Occurrence::Nth(n) => count == n,
            Occurrence::Every(n) => count.is_multiple_of(n),
        }
    }
}

/// What a fault does to the PDU it fires on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Flips every bit of one byte of the BHS (default byte 44, inside the
    /// opcode-specific fields and away from the framing lengths in bytes
    /// 4-7, so the stream stays framed; with HeaderDigest=CRC32C the
    /// receiver sees a header digest error, RFC 7143 section 7.8).
    CorruptHeader {
        /// Byte of the BHS to flip (0-47).
        offset: Option<usize>,
    },
    /// Flips every bit of one byte of the data segment (default the middle
    /// one); a PDU without data is passed on untouched and the fault waits
    /// for the next match. With DataDigest=CRC32C the receiver sees a data
    /// digest error.
    CorruptData {
        /// Byte of the data segment to flip; past its end, the last.
        offset: Option<usize>,
    },
    /// Does not forward the PDU.
    Drop,
    /// Holds the PDU (and with it everything behind it that way) for a
    /// while before forwarding it.
    Delay(Duration),
    /// Forwards nothing in either direction of the connection for a while,
    /// starting before this PDU.
    Stall(Duration),
    /// Closes both sides of the connection instead of forwarding the PDU.
    Cut,
    /// Forwards this many bytes of the connection in the matcher's
    /// direction, then closes both sides.
    CutAfterBytes(u64),
}

/// One fault: what it does, to which PDUs, and when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// What it does.
    pub action: Action,
    /// Which PDUs it counts.
    pub matcher: Matcher,
    /// When among them it fires.
    pub occurrence: Occurrence,
    /// The specification it was parsed from, for logs.
    pub text: String,
}

/// A fault specification that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("bad fault {spec:?}: {reason}")]
pub struct SpecError {
    spec: String,
    reason: String,
}

impl FromStr for Fault {
    type Err = SpecError;

    fn from_str(spec: &str) -> Result<Self, SpecError> {
        let error = |reason: String| SpecError {
            spec: spec.to_owned(),
            reason,
        };
        let spec = spec.trim();
        let (action_text, place) = spec
            .split_once('@')
            .ok_or_else(|| error("want ACTION@WHERE, e.g. corrupt-data@data-in#3".into()))?;
        let (name, argument) = match action_text.split_once('=') {
            Some((name, argument)) => (name, Some(argument)),
            None => (action_text, None),
        };
        let byte_offset = |argument: Option<&str>| -> Result<Option<usize>, SpecError> {
            argument
                .map(|text| {
                    text.parse::<usize>()
                        .map_err(|_| error(format!("{text:?} is not a byte offset")))
                })
                .transpose()
        };
        let needs = |what: &str| error(format!("{name} needs ={what}"));
        let action = match name {
            "corrupt-header" => {
                let offset = byte_offset(argument)?;
                if offset.is_some_and(|at| at >= 48) {
                    return Err(error("the BHS has bytes 0-47".into()));
                }
                Action::CorruptHeader { offset }
            }
            "corrupt-data" => Action::CorruptData {
                offset: byte_offset(argument)?,
            },
            "drop" => Action::Drop,
            "cut" => Action::Cut,
            "delay" => Action::Delay(
                parse_duration(argument.ok_or_else(|| needs("DURATION"))?).map_err(error)?,
            ),
            "stall" => Action::Stall(
                parse_duration(argument.ok_or_else(|| needs("DURATION"))?).map_err(error)?,
            ),
            "cut-after" => {
                let text = argument.ok_or_else(|| needs("BYTES"))?;
                Action::CutAfterBytes(
                    text.parse()
                        .map_err(|_| error(format!("{text:?} is not a byte count")))?,
                )
            }
            other => {
                return Err(error(format!(
                    "unknown action {other:?}: use corrupt-header, corrupt-data, drop, delay, stall, cut or cut-after"
                )));
            }
        };
        let (where_text, occurrence) = match place.find(['#', '%']) {
            Some(at) => {
                let count: u64 =
                    place[at + 1..]
                        .parse()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| {
                            error(format!("{:?} is not a count from 1", &place[at + 1..]))
                        })?;
                let occurrence = if place.as_bytes()[at] == b'#' {
                    Occurrence::Nth(count)
                } else {
                    Occurrence::Every(count)
                };
                (&place[..at], occurrence)
            }
            None => (place, Occurrence::Nth(1)),
        };
        let matcher = match where_text {
            "any" => Matcher::Any,
            "to-target" => Matcher::Direction(Direction::ToTarget),
            "to-initiator" => Matcher::Direction(Direction::ToInitiator),
            kind => PduKind::NAMES
                .iter()
                .find(|(name, _)| *name == kind)
                .map(|(_, opcode)| Matcher::Kind(PduKind(*opcode)))
                .ok_or_else(|| {
                    error(format!(
                        "unknown place {kind:?}: use any, to-target, to-initiator or a PDU kind ({})",
                        PduKind::NAMES.map(|(name, _)| name).join(", ")
                    ))
                })?,
        };
        if let Action::CutAfterBytes(_) = action
            && (!matches!(matcher, Matcher::Direction(_)) || occurrence != Occurrence::Nth(1))
        {
            return Err(error(
                "cut-after counts bytes one way: cut-after=BYTES@to-target or @to-initiator".into(),
            ));
        }
        Ok(Fault {
            action,
            matcher,
            occurrence,
            text: spec.to_owned(),
        })
    }
}

/// Parses `250us`, `20ms`, `1.5s`; a bare number is milliseconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| c.is_ascii_alphabetic()) {
        Some(at) => text.split_at(at),
        None => (text, "ms"),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration: want e.g. 250us, 20ms or 1.5s"))?;
    let seconds = match unit {
        "us" => value / 1e6,
        "ms" => value / 1e3,
        "s" => value,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?}: use us, ms or s"
            ));
        }
    };
    if !(0.0..=3600.0).contains(&seconds) {
        return Err(format!("{text:?} must be between 0 and 1 hour"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Fault {
        text.parse().unwrap()
    }

    #[test]
    fn every_action_parses() {
        assert_eq!(
            parse("corrupt-data@data-in#3").action,
            Action::CorruptData { offset: None }
        );
        assert_eq!(
            parse("corrupt-data@data-in#3").occurrence,
            Occurrence::Nth(3)
        );
        assert_eq!(
            parse("corrupt-header=20@scsi-response").action,
            Action::CorruptHeader { offset: Some(20) }
        );
        assert_eq!(parse("drop@r2t%10").occurrence, Occurrence::Every(10));
        assert_eq!(
            parse("delay=20ms@data-out").action,
            Action::Delay(Duration::from_millis(20))
        );
        assert_eq!(
            parse("stall=1.5s@any#7").action,
            Action::Stall(Duration::from_millis(1500))
        );
        assert_eq!(parse("cut@scsi-command#4").action, Action::Cut);
        let cut_after = parse("cut-after=1000000@to-target");
        assert_eq!(cut_after.action, Action::CutAfterBytes(1_000_000));
        assert_eq!(cut_after.matcher, Matcher::Direction(Direction::ToTarget));
    }

    #[test]
    fn mistakes_are_refused_with_a_reason() {
        for bad in [
            "corrupt-data",
            "corrupt-data@nothing",
            "explode@data-in",
            "delay@data-in",
            "delay=5 parsecs@data-in",
            "corrupt-header=48@data-in",
            "drop@data-in#0",
            "drop@data-in#x",
            "cut-after=10@data-in",
            "cut-after=10@to-target#2",
        ] {
            let error = bad.parse::<Fault>().unwrap_err();
            assert!(error.to_string().contains(bad), "{error}");
        }
    }

    #[test]
    fn occurrences_fire_where_they_say() {
        assert!(Occurrence::Nth(3).fires_at(3));
        assert!(!Occurrence::Nth(3).fires_at(6));
        assert!(Occurrence::Every(3).fires_at(6));
        assert!(!Occurrence::Every(3).fires_at(4));
    }

    #[test]
    fn every_kind_name_round_trips() {
        for (name, opcode) in PduKind::NAMES {
            assert_eq!(PduKind::name_of(opcode), name);
            assert_eq!(
                parse(&format!("drop@{name}")).matcher,
                Matcher::Kind(PduKind(opcode))
            );
        }
        assert_eq!(PduKind::name_of(Opcode::Reserved(0x07)), "opcode-0x07");
    }
}
