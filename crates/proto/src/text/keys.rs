//! The table of text keys: every key of RFC 7143 section 13 (and the
//! security keys of section 12 that the generic engine must recognise), plus
//! the iSER keys of RFC 7145 section 6, each with its value type, legal
//! range, default, result function, scope, when it may be used and who may
//! send it.

/// How the negotiated value follows from the offer and the answer
/// (RFC 7143 sections 6.1 and 6.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueKind {
    /// A list of values in order of preference; the answer is the first one
    /// the responder supports (section 6.1).
    List(&'static [&'static str]),
    /// A number in `min..=max`; the result is the smaller of offer and
    /// answer (section 6.2, "Minimum").
    NumberMin {
        /// The smallest legal value.
        min: u64,
        /// The largest legal value.
        max: u64,
    },
    /// A number in `min..=max`; the result is the larger ("Maximum").
    NumberMax {
        /// The smallest legal value.
        min: u64,
        /// The largest legal value.
        max: u64,
    },
    /// `Yes`/`No`; the result is the AND of offer and answer.
    BooleanAnd,
    /// `Yes`/`No`; the result is the OR of offer and answer.
    BooleanOr,
    /// A declaration: each side states its own value, nothing is answered.
    /// Numeric declarations carry their range.
    Declarative(Option<(u64, u64)>),
    /// A security key handled by the authentication exchange (CHAP), not by
    /// the generic engine.
    Security,
    /// A key obsoleted by RFC 7143 section 13.25 (the markers): answered
    /// with `Reject`.
    Obsolete,
}

/// Whether a key's value applies to the session or to one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// SW: session-wide.
    Session,
    /// CO: this connection only.
    Connection,
}

/// When a key may be used (the "Use" line of each key's definition).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// LO: only on the leading connection's login.
    LeadingOnly,
    /// IO: only during the login of a connection.
    InitialOnly,
    /// FFPO: only in full feature phase (Text Requests).
    FullFeatureOnly,
    /// ALL: during login and in full feature phase.
    All,
    /// Only in the security negotiation stage.
    SecurityOnly,
}

/// Who may send a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sender {
    /// Only the initiator.
    Initiator,
    /// Only the target.
    Target,
    /// Either side.
    Both,
}

/// One key's definition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyDefinition {
    /// The key name as it appears on the wire.
    pub name: &'static str,
    /// Where it is defined, e.g. `RFC 7143 13.14`.
    pub section: &'static str,
    /// The value type and result function.
    pub kind: ValueKind,
    /// The value that holds when the key is not negotiated (`""` if none).
    pub default: &'static str,
    /// When it may be used.
    pub usage: Usage,
    /// Session or connection scope.
    pub scope: Scope,
    /// Who may send it.
    pub sender: Sender,
    /// Whether it is irrelevant in a discovery session.
    pub irrelevant_in_discovery: bool,
}

const LENGTH_MIN: u64 = 512;
const LENGTH_MAX: u64 = (1 << 24) - 1;

const fn key(
    name: &'static str,
    section: &'static str,
    kind: ValueKind,
    default: &'static str,
    usage: Usage,
    scope: Scope,
    sender: Sender,
) -> KeyDefinition {
    KeyDefinition {
        name,
        section,
        kind,
        default,
        usage,
        scope,
        sender,
        irrelevant_in_discovery: false,
    }
}

/// A session-wide operational key negotiated on the leading connection,
/// irrelevant in discovery sessions.
const fn leading(
    name: &'static str,
    section: &'static str,
    kind: ValueKind,
    default: &'static str,
) -> KeyDefinition {
    KeyDefinition {
        irrelevant_in_discovery: true,
        ..key(
            name,
            section,
            kind,
            default,
            Usage::LeadingOnly,
            Scope::Session,
            Sender::Both,
        )
    }
}

use Scope::{Connection, Session};
use Sender::{Both, Initiator, Target};
use Usage::{All, FullFeatureOnly, InitialOnly, LeadingOnly, SecurityOnly};
use ValueKind::*;

/// Every key this implementation knows.
pub static KEYS: &[KeyDefinition] = &[
    key(
        "AuthMethod",
        "RFC 7143 12.1",
        List(&["None", "CHAP", "SRP", "KRB5", "SPKM1", "SPKM2"]),
        "None",
        SecurityOnly,
        Connection,
        Both,
    ),
    key(
        "CHAP_A",
        "RFC 7143 12.1.3",
        Security,
        "",
        SecurityOnly,
        Connection,
        Both,
    ),
    key(
        "CHAP_I",
        "RFC 7143 12.1.3",
        Security,
        "",
        SecurityOnly,
        Connection,
        Both,
    ),
    key(
        "CHAP_C",
        "RFC 7143 12.1.3",
        Security,
        "",
        SecurityOnly,
        Connection,
        Both,
    ),
    key(
        "CHAP_N",
        "RFC 7143 12.1.3",
        Security,
        "",
        SecurityOnly,
        Connection,
        Both,
    ),
    key(
        "CHAP_R",
        "RFC 7143 12.1.3",
        Security,
        "",
        SecurityOnly,
        Connection,
        Both,
    ),
    key(
        "HeaderDigest",
        "RFC 7143 13.1",
        List(&["CRC32C", "None"]),
        "None",
        InitialOnly,
        Connection,
        Both,
    ),
    key(
        "DataDigest",
        "RFC 7143 13.1",
        List(&["CRC32C", "None"]),
        "None",
        InitialOnly,
        Connection,
        Both,
    ),
    leading(
        "MaxConnections",
        "RFC 7143 13.2",
        NumberMin { min: 1, max: 65535 },
        "1",
    ),
    key(
        "SendTargets",
        "RFC 7143 13.3",
        Declarative(None),
        "",
        FullFeatureOnly,
        Session,
        Initiator,
    ),
    key(
        "TargetName",
        "RFC 7143 13.4",
        Declarative(None),
        "",
        All,
        Session,
        Both,
    ),
    key(
        "InitiatorName",
        "RFC 7143 13.5",
        Declarative(None),
        "",
        InitialOnly,
        Session,
        Initiator,
    ),
    key(
        "TargetAlias",
        "RFC 7143 13.6",
        Declarative(None),
        "",
        All,
        Session,
        Target,
    ),
    key(
        "InitiatorAlias",
        "RFC 7143 13.7",
        Declarative(None),
        "",
        All,
        Session,
        Initiator,
    ),
    key(
        "TargetAddress",
        "RFC 7143 13.8",
        Declarative(None),
        "",
        All,
        Session,
        Target,
    ),
    key(
        "TargetPortalGroupTag",
        "RFC 7143 13.9",
        Declarative(Some((0, 65535))),
        "",
        InitialOnly,
        Session,
        Target,
    ),
    leading("InitialR2T", "RFC 7143 13.10", BooleanOr, "Yes"),
    leading("ImmediateData", "RFC 7143 13.11", BooleanAnd, "Yes"),
    key(
        "MaxRecvDataSegmentLength",
        "RFC 7143 13.12",
        Declarative(Some((LENGTH_MIN, LENGTH_MAX))),
        "8192",
        All,
        Connection,
        Both,
    ),
    leading(
        "MaxBurstLength",
        "RFC 7143 13.13",
        NumberMin {
            min: LENGTH_MIN,
            max: LENGTH_MAX,
        },
        "262144",
    ),
    leading(
        "FirstBurstLength",
        "RFC 7143 13.14",
        NumberMin {
            min: LENGTH_MIN,
            max: LENGTH_MAX,
        },
        "65536",
    ),
    // Negotiated in discovery sessions too: unlike the data transfer keys,
    // RFC 7143 does not make it irrelevant there, tgt answers it, and
    // Linux's initiator refuses a discovery login that answers Irrelevant.
    key(
        "DefaultTime2Wait",
        "RFC 7143 13.15",
        NumberMax { min: 0, max: 3600 },
        "2",
        Usage::LeadingOnly,
        Scope::Session,
        Sender::Both,
    ),
    // Negotiated in discovery sessions too: unlike the data transfer keys,
    // RFC 7143 does not make it irrelevant there, tgt answers it, and
    // Linux's initiator refuses a discovery login that answers Irrelevant.
    key(
        "DefaultTime2Retain",
        "RFC 7143 13.16",
        NumberMin { min: 0, max: 3600 },
        "20",
        Usage::LeadingOnly,
        Scope::Session,
        Sender::Both,
    ),
    leading(
        "MaxOutstandingR2T",
        "RFC 7143 13.17",
        NumberMin { min: 1, max: 65535 },
        "1",
    ),
    leading("DataPDUInOrder", "RFC 7143 13.18", BooleanOr, "Yes"),
    leading("DataSequenceInOrder", "RFC 7143 13.19", BooleanOr, "Yes"),
    // Negotiated in discovery sessions too: unlike the data transfer keys,
    // RFC 7143 does not make it irrelevant there, tgt answers it, and
    // Linux's initiator refuses a discovery login that answers Irrelevant.
    key(
        "ErrorRecoveryLevel",
        "RFC 7143 13.20",
        NumberMin { min: 0, max: 2 },
        "0",
        Usage::LeadingOnly,
        Scope::Session,
        Sender::Both,
    ),
    key(
        "SessionType",
        "RFC 7143 13.21",
        Declarative(None),
        "Normal",
        LeadingOnly,
        Session,
        Initiator,
    ),
    key(
        "TaskReporting",
        "RFC 7143 13.23",
        List(&["RFC3720", "ResponseFence", "FastAbort"]),
        "RFC3720",
        LeadingOnly,
        Session,
        Both,
    ),
    key(
        "iSCSIProtocolLevel",
        "RFC 7143 13.24",
        NumberMin { min: 0, max: 31 },
        "1",
        LeadingOnly,
        Session,
        Both,
    ),
    key(
        "IFMarker",
        "RFC 7143 13.25",
        Obsolete,
        "",
        All,
        Connection,
        Both,
    ),
    key(
        "OFMarker",
        "RFC 7143 13.25",
        Obsolete,
        "",
        All,
        Connection,
        Both,
    ),
    key(
        "IFMarkInt",
        "RFC 7143 13.25",
        Obsolete,
        "",
        All,
        Connection,
        Both,
    ),
    key(
        "OFMarkInt",
        "RFC 7143 13.25",
        Obsolete,
        "",
        All,
        Connection,
        Both,
    ),
    key(
        "X#NodeArchitecture",
        "RFC 7143 13.26",
        Declarative(None),
        "",
        LeadingOnly,
        Session,
        Both,
    ),
    key(
        "RDMAExtensions",
        "RFC 7145 6.3",
        BooleanAnd,
        "No",
        LeadingOnly,
        Session,
        Both,
    ),
    key(
        "TargetRecvDataSegmentLength",
        "RFC 7145 6.1",
        Declarative(Some((LENGTH_MIN, LENGTH_MAX))),
        "8192",
        InitialOnly,
        Session,
        Both,
    ),
    key(
        "InitiatorRecvDataSegmentLength",
        "RFC 7145 6.2",
        Declarative(Some((LENGTH_MIN, LENGTH_MAX))),
        "8192",
        InitialOnly,
        Session,
        Both,
    ),
    key(
        "MaxOutstandingUnexpectedPDUs",
        "RFC 7145 6.4",
        Declarative(Some((0, u32::MAX as u64))),
        "0",
        LeadingOnly,
        Session,
        Both,
    ),
];

/// The definition of `name`, if it is a key this implementation knows.
pub fn lookup(name: &str) -> Option<&'static KeyDefinition> {
    KEYS.iter().find(|k| k.name == name)
}

/// Whether `name` is a private (`X-`) or IANA-registered (`X#`) extension key
/// (RFC 7143 section 13.22).
pub fn is_extension_key(name: &str) -> bool {
    name.starts_with("X-") || name.starts_with("X#")
}

/// Parses a numeric value: decimal, or hexadecimal after `0x`/`0X`
/// (RFC 7143 section 6, "numerical-value").
pub fn parse_number(value: &str) -> Option<u64> {
    if let Some(hex) = value
        .strip_prefix("0x")
        .or_else(|| value.strip_prefix("0X"))
    {
        if hex.is_empty() || hex.len() > 16 {
            return None;
        }
        u64::from_str_radix(hex, 16).ok()
    } else if !value.is_empty() && value.len() <= 20 && value.bytes().all(|b| b.is_ascii_digit()) {
        value.parse().ok()
    } else {
        None
    }
}

/// Parses `Yes`/`No`.
pub fn parse_boolean(value: &str) -> Option<bool> {
    match value {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

/// Formats a boolean as `Yes`/`No`.
pub fn format_boolean(value: bool) -> &'static str {
    if value { "Yes" } else { "No" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_is_legal_for_its_key() {
        for def in KEYS {
            match def.kind {
                NumberMin { min, max } | NumberMax { min, max } => {
                    let v = parse_number(def.default).expect(def.name);
                    assert!((min..=max).contains(&v), "{}", def.name);
                }
                BooleanAnd | BooleanOr => {
                    assert!(parse_boolean(def.default).is_some(), "{}", def.name)
                }
                List(values) => assert!(values.contains(&def.default), "{}", def.name),
                Declarative(Some((min, max))) => {
                    if !def.default.is_empty() {
                        let v = parse_number(def.default).expect(def.name);
                        assert!((min..=max).contains(&v), "{}", def.name);
                    }
                }
                Declarative(None) | Security | Obsolete => {}
            }
        }
    }

    #[test]
    fn names_are_unique() {
        for (i, a) in KEYS.iter().enumerate() {
            assert!(KEYS[i + 1..].iter().all(|b| b.name != a.name), "{}", a.name);
        }
    }

    #[test]
    fn the_rfc_table_values() {
        // Spot checks of RFC 7143 section 13 against the table.
        let mbl = lookup("MaxBurstLength").unwrap();
        assert_eq!(mbl.default, "262144");
        assert_eq!(
            mbl.kind,
            NumberMin {
                min: 512,
                max: 16_777_215
            }
        );
        assert_eq!(lookup("FirstBurstLength").unwrap().default, "65536");
        assert_eq!(
            lookup("DefaultTime2Wait").unwrap().kind,
            NumberMax { min: 0, max: 3600 }
        );
        assert_eq!(lookup("DefaultTime2Retain").unwrap().default, "20");
        assert_eq!(lookup("InitialR2T").unwrap().kind, BooleanOr);
        assert_eq!(lookup("ImmediateData").unwrap().kind, BooleanAnd);
        assert_eq!(lookup("HeaderDigest").unwrap().scope, Scope::Connection);
        assert_eq!(lookup("MaxRecvDataSegmentLength").unwrap().default, "8192");
        assert_eq!(
            lookup("ErrorRecoveryLevel").unwrap().kind,
            NumberMin { min: 0, max: 2 }
        );
        assert_eq!(lookup("RDMAExtensions").unwrap().default, "No");
        assert!(lookup("Unknown").is_none());
    }

    #[test]
    fn numbers_in_decimal_and_hex() {
        assert_eq!(parse_number("8192"), Some(8192));
        assert_eq!(parse_number("0x2000"), Some(8192));
        assert_eq!(parse_number("0X2000"), Some(8192));
        assert_eq!(parse_number(""), None);
        assert_eq!(parse_number("0x"), None);
        assert_eq!(parse_number("-1"), None);
        assert_eq!(parse_number("12a"), None);
        assert_eq!(parse_number("99999999999999999999999"), None);
    }
}
