//! Login Request and Login Response (RFC 7143 sections 11.12 and 11.13),
//! with the ISID (section 11.12.5) and the login status codes (section
//! 11.13.5). The key=value data segment is the `text` module's business.

use super::bhs::wire_enum;
use super::wire::BHS_LEN;
use super::wire::{flag, put_sn, put_u16, put_u32, sn_at, u16_at, u32_at};
use crate::serial::{CmdSn, StatSn};

wire_enum! {
    /// A login stage, the CSG and NSG fields (RFC 7143 section 11.12.3, 2
    /// bits).
    LoginStage {
        /// 0: SecurityNegotiation.
        #[default]
        SecurityNegotiation = 0,
        /// 1: LoginOperationalNegotiation.
        LoginOperationalNegotiation = 1,
        /// 3: FullFeaturePhase.
        FullFeaturePhase = 3,
    }
    /// 2: reserved.
    Reserved
}

/// Byte 1 of a login PDU: T, C, CSG, NSG (RFC 7143 section 11.12.1-11.12.3).
fn stage_byte(transit: bool, cont: bool, csg: LoginStage, nsg: LoginStage) -> u8 {
    flag(transit, 0x80) | flag(cont, 0x40) | ((csg.to_u8() & 0x03) << 2) | (nsg.to_u8() & 0x03)
}

wire_enum! {
    /// The T field of an ISID: how the rest is formatted (RFC 7143 section
    /// 11.12.5, 2 bits).
    IsidType {
        /// 0b00: OUI format (A and B hold an IEEE OUI, C and D a qualifier).
        #[default]
        Oui = 0,
        /// 0b01: IANA Enterprise Number format.
        EnterpriseNumber = 1,
        /// 0b10: Random format.
        Random = 2,
    }
    /// 0b11: reserved.
    Reserved
}

/// The initiator part of the session identifier (RFC 7143 section
/// 11.12.5): 6 bytes, `T(2 bits) A(6 bits) | B(16) | C(8) | D(16)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Isid {
    /// T: the format.
    pub kind: IsidType,
    /// A: 6 bits (higher bits are dropped on encode).
    pub a: u8,
    /// B.
    pub b: u16,
    /// C.
    pub c: u8,
    /// D: the qualifier.
    pub d: u16,
}

impl Isid {
    /// Decodes the 6 wire bytes.
    pub fn from_bytes(v: [u8; 6]) -> Self {
        Isid {
            kind: IsidType::from_u8(v[0] >> 6),
            a: v[0] & 0x3f,
            b: u16::from_be_bytes([v[1], v[2]]),
            c: v[3],
            d: u16::from_be_bytes([v[4], v[5]]),
        }
    }

    /// The 6 wire bytes.
    pub fn to_bytes(self) -> [u8; 6] {
        let [b0, b1] = self.b.to_be_bytes();
        let [d0, d1] = self.d.to_be_bytes();
        [
            ((self.kind.to_u8() & 0x03) << 6) | (self.a & 0x3f),
            b0,
            b1,
            self.c,
            d0,
            d1,
        ]
    }
}

/// The ISID at BHS bytes 8-13.
fn isid_at(b: &[u8; BHS_LEN]) -> Isid {
    Isid::from_bytes([b[8], b[9], b[10], b[11], b[12], b[13]])
}

/// Login Request PDU, opcode 0x03, always immediate (RFC 7143 section
/// 11.12). The I bit is always written as 1.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LoginRequest {
    /// T bit: the initiator is ready to move to `next_stage` (11.12.1).
    pub transit: bool,
    /// C bit: the text is continued in a later PDU (11.12.2).
    pub continue_flag: bool,
    /// CSG: current stage (11.12.3).
    pub current_stage: LoginStage,
    /// NSG: next stage, meaningful when `transit` (11.12.3).
    pub next_stage: LoginStage,
    /// Version-max (11.12.4); 0x00 in RFC 7143.
    pub version_max: u8,
    /// Version-min (11.12.4).
    pub version_min: u8,
    /// ISID (11.12.5).
    pub isid: Isid,
    /// TSIH: 0 for a new session (11.12.6).
    pub tsih: u16,
    /// Initiator Task Tag.
    pub initiator_task_tag: u32,
    /// CID: the connection ID (11.12.7).
    pub cid: u16,
    /// CmdSN (11.12.8).
    pub cmd_sn: CmdSn,
    /// ExpStatSN, or reserved on the first login PDU (11.12.9).
    pub exp_stat_sn: StatSn,
}

impl LoginRequest {
    /// Decodes from a BHS with opcode 0x03.
    pub(crate) fn decode(b: &[u8; BHS_LEN]) -> Self {
        LoginRequest {
            transit: b[1] & 0x80 != 0,
            continue_flag: b[1] & 0x40 != 0,
            current_stage: LoginStage::from_u8((b[1] >> 2) & 0x03),
            next_stage: LoginStage::from_u8(b[1] & 0x03),
            version_max: b[2],
            version_min: b[3],
            isid: isid_at(b),
            tsih: u16_at(b, 14),
            initiator_task_tag: u32_at(b, 16),
            cid: u16_at(b, 20),
            cmd_sn: sn_at(b, 24),
            exp_stat_sn: sn_at(b, 28),
        }
    }

    /// Encodes into a zeroed BHS.
    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[0] = 0x43;
        b[1] = stage_byte(
            self.transit,
            self.continue_flag,
            self.current_stage,
            self.next_stage,
        );
        b[2] = self.version_max;
        b[3] = self.version_min;
        b[8..14].copy_from_slice(&self.isid.to_bytes());
        put_u16(b, 14, self.tsih);
        put_u32(b, 16, self.initiator_task_tag);
        put_u16(b, 20, self.cid);
        put_sn(b, 24, self.cmd_sn);
        put_sn(b, 28, self.exp_stat_sn);
    }
}

wire_enum! {
    /// Status-Class of a Login Response (RFC 7143 section 11.13.5).
    StatusClass {
        /// 0: Success.
        #[default]
        Success = 0,
        /// 1: Redirection: the initiator should try another address.
        Redirection = 1,
        /// 2: Initiator Error: not to be retried as is.
        InitiatorError = 2,
        /// 3: Target Error: may be retried.
        TargetError = 3,
    }
    /// Any other value: reserved.
    Reserved
}

/// Status-Class and Status-Detail of a Login Response (RFC 7143 section
/// 11.13.5), with the pairs the RFC names as constants.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LoginStatus {
    /// Status-Class.
    pub class: u8,
    /// Status-Detail.
    pub detail: u8,
}

impl LoginStatus {
    /// 0x0000 Success.
    pub const SUCCESS: Self = Self::new(0, 0);
    /// 0x0101 Target moved temporarily (TargetAddress in the data).
    pub const TARGET_MOVED_TEMPORARILY: Self = Self::new(1, 1);
    /// 0x0102 Target moved permanently.
    pub const TARGET_MOVED_PERMANENTLY: Self = Self::new(1, 2);
    /// 0x0200 Initiator error (miscellaneous).
    pub const INITIATOR_ERROR: Self = Self::new(2, 0);
    /// 0x0201 Authentication failure.
    pub const AUTHENTICATION_FAILURE: Self = Self::new(2, 1);
    /// 0x0202 Authorization failure.
    pub const AUTHORIZATION_FAILURE: Self = Self::new(2, 2);
    /// 0x0203 Not found.
    pub const NOT_FOUND: Self = Self::new(2, 3);
    /// 0x0204 Target removed.
    pub const TARGET_REMOVED: Self = Self::new(2, 4);
    /// 0x0205 Unsupported version.
    pub const UNSUPPORTED_VERSION: Self = Self::new(2, 5);
    /// 0x0206 Too many connections.
    pub const TOO_MANY_CONNECTIONS: Self = Self::new(2, 6);
    /// 0x0207 Missing parameter.
    pub const MISSING_PARAMETER: Self = Self::new(2, 7);
    /// 0x0208 Can't include in session.
    pub const CANT_INCLUDE_IN_SESSION: Self = Self::new(2, 8);
    /// 0x0209 Session type not supported.
    pub const SESSION_TYPE_NOT_SUPPORTED: Self = Self::new(2, 9);
    /// 0x020a Session does not exist.
    pub const SESSION_DOES_NOT_EXIST: Self = Self::new(2, 0x0a);
    /// 0x020b Invalid request during login.
    pub const INVALID_DURING_LOGIN: Self = Self::new(2, 0x0b);
    /// 0x0300 Target error (miscellaneous).
    pub const TARGET_ERROR: Self = Self::new(3, 0);
    /// 0x0301 Service unavailable.
    pub const SERVICE_UNAVAILABLE: Self = Self::new(3, 1);
    /// 0x0302 Out of resources.
    pub const OUT_OF_RESOURCES: Self = Self::new(3, 2);

    /// The status `class`/`detail`.
    pub const fn new(class: u8, detail: u8) -> Self {
        LoginStatus { class, detail }
    }

    /// The class as an enum.
    pub const fn status_class(self) -> StatusClass {
        StatusClass::from_u8(self.class)
    }

    /// What the status means, in the words of RFC 7143 section 11.13.5
    /// (for messages and logs: "authentication failure").
    pub const fn meaning(self) -> &'static str {
        match (self.class, self.detail) {
            (0, 0) => "success",
            (1, 1) => "target moved temporarily",
            (1, 2) => "target moved permanently",
            (1, _) => "redirection",
            (2, 0) => "initiator error",
            (2, 1) => "authentication failure",
            (2, 2) => "authorization failure",
            (2, 3) => "target not found",
            (2, 4) => "target removed",
            (2, 5) => "unsupported version",
            (2, 6) => "too many connections",
            (2, 7) => "missing parameter",
            (2, 8) => "cannot include the connection in the session",
            (2, 9) => "session type not supported",
            (2, 0x0a) => "session does not exist",
            (2, 0x0b) => "invalid request during login",
            (2, _) => "initiator error",
            (3, 0) => "target error",
            (3, 1) => "service unavailable",
            (3, 2) => "out of resources",
            (3, _) => "target error",
            _ => "unknown status",
        }
    }
}

/// `0x0201 authentication failure`: the status as logs and messages show
/// it, the code first so that it can be searched for.
impl std::fmt::Display for LoginStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:#04x}{:02x} {}",
            self.class,
            self.detail,
            self.meaning()
        )
    }
}

/// Login Response PDU, opcode 0x23 (RFC 7143 section 11.13).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LoginResponse {
    /// T bit: the target moves to `next_stage` (11.13.3).
    pub transit: bool,
    /// C bit: the text is continued in a later PDU.
    pub continue_flag: bool,
    /// CSG: current stage.
    pub current_stage: LoginStage,
    /// NSG: next stage, meaningful when `transit`.
    pub next_stage: LoginStage,
    /// Version-max (11.13.1).
    pub version_max: u8,
    /// Version-active (11.13.2).
    pub version_active: u8,
    /// ISID, echoed.
    pub isid: Isid,
    /// TSIH: the target's session handle, set on the final response (11.13.4).
    pub tsih: u16,
    /// Initiator Task Tag.
    pub initiator_task_tag: u32,
    /// StatSN.
    pub stat_sn: StatSn,
    /// ExpCmdSN.
    pub exp_cmd_sn: CmdSn,
    /// MaxCmdSN.
    pub max_cmd_sn: CmdSn,
    /// Status-Class and Status-Detail (11.13.5).
    pub status: LoginStatus,
}

impl LoginResponse {
    /// Decodes from a BHS with opcode 0x23.
    pub(crate) fn decode(b: &[u8; BHS_LEN]) -> Self {
        LoginResponse {
            transit: b[1] & 0x80 != 0,
            continue_flag: b[1] & 0x40 != 0,
            current_stage: LoginStage::from_u8((b[1] >> 2) & 0x03),
            next_stage: LoginStage::from_u8(b[1] & 0x03),
            version_max: b[2],
            version_active: b[3],
            isid: isid_at(b),
            tsih: u16_at(b, 14),
            initiator_task_tag: u32_at(b, 16),
            stat_sn: sn_at(b, 24),
            exp_cmd_sn: sn_at(b, 28),
            max_cmd_sn: sn_at(b, 32),
            status: LoginStatus::new(b[36], b[37]),
        }
    }

    /// Encodes into a zeroed BHS.
    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[0] = 0x23;
        b[1] = stage_byte(
            self.transit,
            self.continue_flag,
            self.current_stage,
            self.next_stage,
        );
        b[2] = self.version_max;
        b[3] = self.version_active;
        b[8..14].copy_from_slice(&self.isid.to_bytes());
        put_u16(b, 14, self.tsih);
        put_u32(b, 16, self.initiator_task_tag);
        put_sn(b, 24, self.stat_sn);
        put_sn(b, 28, self.exp_cmd_sn);
        put_sn(b, 32, self.max_cmd_sn);
        b[36] = self.status.class;
        b[37] = self.status.detail;
    }
}
