//! Sense data (SPC-4 §4.5): the sense keys, the additional sense codes the
//! target reports, and the fixed (0x70) and descriptor (0x72) encodings.
//!
//! Every ASC/ASCQ pair the target sends is a named constant checked against
//! SPC-4's Annex D table ("ASC and ASCQ assignments"); nothing in the SCSI
//! target core (`iscsi-scsi`) writes a raw ASC number.
//!
//! The same types put sense data into words for people (the `Display`
//! impls, over T10's names in `asc_names.rs`): the initiator and the CLI
//! print a CHECK CONDITION through them, so there is one table to extend.
//!
//! Why a crate of its own: both sides of the stack speak sense data. The
//! target (`iscsi-scsi`, which re-exports this crate as `iscsi_scsi::sense`)
//! builds and encodes it; the initiator (`iscsi-initiator`) only decodes it
//! and prints it in words. Kept here, with nothing but `std` beneath it, the
//! initiator gets the sense keys and T10's names without depending on the
//! whole target core (its logical units, backstores and their
//! dependencies), and the two sides still print sense data the same way.

use std::fmt;

mod asc_names;

/// A sense key (SPC-4 Table 28): every 4-bit value has a variant, so any
/// received sense data maps onto one ([`SenseKey::from_code`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SenseKey {
    /// 0x0: no specific sense key information.
    NoSense = 0x0,
    /// 0x1: the command completed with recovery action.
    RecoveredError = 0x1,
    /// 0x2: the logical unit cannot be accessed.
    NotReady = 0x2,
    /// 0x3: a non-recovered error caused by a flaw in the medium.
    MediumError = 0x3,
    /// 0x4: a non-recoverable hardware failure.
    HardwareError = 0x4,
    /// 0x5: an illegal parameter in the CDB or parameter list.
    IllegalRequest = 0x5,
    /// 0x6: a unit attention condition (reset, parameters changed, ...).
    UnitAttention = 0x6,
    /// 0x7: the medium is write-protected.
    DataProtect = 0x7,
    /// 0x8: blank or end-of-data medium (sequential access devices).
    BlankCheck = 0x8,
    /// 0x9: a vendor-specific condition.
    VendorSpecific = 0x9,
    /// 0xA: an EXTENDED COPY was aborted.
    CopyAborted = 0xA,
    /// 0xB: the device server aborted the command.
    AbortedCommand = 0xB,
    /// 0xC: obsolete (EQUAL, for the SEARCH DATA commands of SCSI-2).
    Equal = 0xC,
    /// 0xD: the medium is full (sequential access devices).
    VolumeOverflow = 0xD,
    /// 0xE: the source data did not match (COMPARE AND WRITE).
    Miscompare = 0xE,
    /// 0xF: the command completed with sense data to report (SPC-5).
    Completed = 0xF,
}

impl SenseKey {
    /// The 4-bit wire value.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The key of a SENSE KEY field; the upper four bits are ignored (in
    /// fixed format they hold FILEMARK, EOM, ILI and SDAT_OVFL).
    pub const fn from_code(code: u8) -> Self {
        match code & 0x0F {
            0x0 => Self::NoSense,
            0x1 => Self::RecoveredError,
            0x2 => Self::NotReady,
            0x3 => Self::MediumError,
            0x4 => Self::HardwareError,
            0x5 => Self::IllegalRequest,
            0x6 => Self::UnitAttention,
            0x7 => Self::DataProtect,
            0x8 => Self::BlankCheck,
            0x9 => Self::VendorSpecific,
            0xA => Self::CopyAborted,
            0xB => Self::AbortedCommand,
            0xC => Self::Equal,
            0xD => Self::VolumeOverflow,
            0xE => Self::Miscompare,
            _ => Self::Completed,
        }
    }

    /// The key's name as sg3-utils and the Linux kernel print it ("Illegal
    /// Request"), so a message reads the same from every tool.
    pub const fn name(self) -> &'static str {
        match self {
            Self::NoSense => "No Sense",
            Self::RecoveredError => "Recovered Error",
            Self::NotReady => "Not Ready",
            Self::MediumError => "Medium Error",
            Self::HardwareError => "Hardware Error",
            Self::IllegalRequest => "Illegal Request",
            Self::UnitAttention => "Unit Attention",
            Self::DataProtect => "Data Protect",
            Self::BlankCheck => "Blank Check",
            Self::VendorSpecific => "Vendor Specific",
            Self::CopyAborted => "Copy Aborted",
            Self::AbortedCommand => "Aborted Command",
            Self::Equal => "Equal",
            Self::VolumeOverflow => "Volume Overflow",
            Self::Miscompare => "Miscompare",
            Self::Completed => "Completed",
        }
    }
}

impl fmt::Display for SenseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An additional sense code and qualifier pair (ASC, ASCQ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Asc {
    /// ADDITIONAL SENSE CODE.
    pub asc: u8,
    /// ADDITIONAL SENSE CODE QUALIFIER.
    pub ascq: u8,
}

impl Asc {
    /// 00/00 NO ADDITIONAL SENSE INFORMATION.
    pub const NO_ADDITIONAL_SENSE: Self = Self::new(0x00, 0x00);
    /// 08/00 LOGICAL UNIT COMMUNICATION FAILURE.
    pub const LU_COMMUNICATION_FAILURE: Self = Self::new(0x08, 0x00);
    /// 08/01 LOGICAL UNIT COMMUNICATION TIME-OUT.
    pub const LU_COMMUNICATION_TIMEOUT: Self = Self::new(0x08, 0x01);
    /// 08/04 UNREACHABLE COPY TARGET.
    pub const UNREACHABLE_COPY_TARGET: Self = Self::new(0x08, 0x04);
    /// 0D/02 COPY TARGET DEVICE NOT REACHABLE.
    pub const COPY_TARGET_DEVICE_NOT_REACHABLE: Self = Self::new(0x0D, 0x02);
    /// 26/06 TOO MANY TARGET DESCRIPTORS.
    pub const TOO_MANY_TARGET_DESCRIPTORS: Self = Self::new(0x26, 0x06);
    /// 26/07 UNSUPPORTED TARGET DESCRIPTOR TYPE CODE.
    pub const UNSUPPORTED_TARGET_DESCRIPTOR_TYPE: Self = Self::new(0x26, 0x07);
    /// 26/08 TOO MANY SEGMENT DESCRIPTORS.
    pub const TOO_MANY_SEGMENT_DESCRIPTORS: Self = Self::new(0x26, 0x08);
    /// 26/09 UNSUPPORTED SEGMENT DESCRIPTOR TYPE CODE.
    pub const UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE: Self = Self::new(0x26, 0x09);
    /// 00/16 OPERATION IN PROGRESS.
    pub const OPERATION_IN_PROGRESS: Self = Self::new(0x00, 0x16);
    /// 0C/00 WRITE ERROR.
    pub const WRITE_ERROR: Self = Self::new(0x0C, 0x00);
    /// 11/00 UNRECOVERED READ ERROR.
    pub const UNRECOVERED_READ_ERROR: Self = Self::new(0x11, 0x00);
    /// 1A/00 PARAMETER LIST LENGTH ERROR.
    pub const PARAMETER_LIST_LENGTH_ERROR: Self = Self::new(0x1A, 0x00);
    /// 20/00 INVALID COMMAND OPERATION CODE.
    pub const INVALID_COMMAND_OPERATION_CODE: Self = Self::new(0x20, 0x00);
    /// 21/00 LOGICAL BLOCK ADDRESS OUT OF RANGE.
    pub const LBA_OUT_OF_RANGE: Self = Self::new(0x21, 0x00);
    /// 24/00 INVALID FIELD IN CDB.
    pub const INVALID_FIELD_IN_CDB: Self = Self::new(0x24, 0x00);
    /// 25/00 LOGICAL UNIT NOT SUPPORTED.
    pub const LOGICAL_UNIT_NOT_SUPPORTED: Self = Self::new(0x25, 0x00);
    /// 04/1B LOGICAL UNIT NOT READY, SANITIZE IN PROGRESS.
    pub const SANITIZE_IN_PROGRESS: Self = Self::new(0x04, 0x1B);
    /// 31/03 SANITIZE COMMAND FAILED.
    pub const SANITIZE_COMMAND_FAILED: Self = Self::new(0x31, 0x03);
    /// 26/00 INVALID FIELD IN PARAMETER LIST.
    pub const INVALID_FIELD_IN_PARAMETER_LIST: Self = Self::new(0x26, 0x00);
    /// 29/00 POWER ON, RESET, OR BUS DEVICE RESET OCCURRED.
    pub const POWER_ON_RESET: Self = Self::new(0x29, 0x00);
    /// 2A/01 MODE PARAMETERS CHANGED.
    pub const MODE_PARAMETERS_CHANGED: Self = Self::new(0x2A, 0x01);
    /// 2A/09 CAPACITY DATA HAS CHANGED (the medium was resized).
    pub const CAPACITY_DATA_HAS_CHANGED: Self = Self::new(0x2A, 0x09);
    /// 39/00 SAVING PARAMETERS NOT SUPPORTED.
    pub const SAVING_PARAMETERS_NOT_SUPPORTED: Self = Self::new(0x39, 0x00);
    /// 3A/00 MEDIUM NOT PRESENT.
    pub const MEDIUM_NOT_PRESENT: Self = Self::new(0x3A, 0x00);
    /// 27/00 WRITE PROTECTED.
    pub const WRITE_PROTECTED: Self = Self::new(0x27, 0x00);
    /// 28/00 NOT READY TO READY CHANGE, MEDIUM MAY HAVE CHANGED.
    pub const MEDIUM_MAY_HAVE_CHANGED: Self = Self::new(0x28, 0x00);
    /// 53/02 MEDIUM REMOVAL PREVENTED.
    pub const MEDIUM_REMOVAL_PREVENTED: Self = Self::new(0x53, 0x02);
    /// 1D/00 MISCOMPARE DURING VERIFY OPERATION.
    pub const MISCOMPARE_DURING_VERIFY: Self = Self::new(0x1D, 0x00);
    /// 26/04 INVALID RELEASE OF PERSISTENT RESERVATION.
    pub const INVALID_RELEASE_OF_PR: Self = Self::new(0x26, 0x04);
    /// 29/01 POWER ON OCCURRED.
    pub const POWER_ON_OCCURRED: Self = Self::new(0x29, 0x01);
    /// 29/03 BUS DEVICE RESET FUNCTION OCCURRED.
    pub const BUS_DEVICE_RESET: Self = Self::new(0x29, 0x03);
    /// 29/07 I_T NEXUS LOSS OCCURRED.
    pub const I_T_NEXUS_LOSS: Self = Self::new(0x29, 0x07);
    /// 2A/03 RESERVATIONS PREEMPTED.
    pub const RESERVATIONS_PREEMPTED: Self = Self::new(0x2A, 0x03);
    /// 2A/04 RESERVATIONS RELEASED.
    pub const RESERVATIONS_RELEASED: Self = Self::new(0x2A, 0x04);
    /// 2A/05 REGISTRATIONS PREEMPTED.
    pub const REGISTRATIONS_PREEMPTED: Self = Self::new(0x2A, 0x05);
    /// 3F/0E REPORTED LUNS DATA HAS CHANGED: the LUN inventory changed
    /// (a LUN added or removed while nexuses exist, SPC-4 §6.33).
    pub const REPORTED_LUNS_DATA_HAS_CHANGED: Self = Self::new(0x3F, 0x0E);
    /// 04/0A LOGICAL UNIT NOT ACCESSIBLE, ASYMMETRIC ACCESS STATE
    /// TRANSITION.
    pub const ALUA_STATE_TRANSITION: Self = Self::new(0x04, 0x0A);
    /// 04/0B LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE.
    pub const ALUA_STANDBY: Self = Self::new(0x04, 0x0B);
    /// 04/0C LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN UNAVAILABLE STATE.
    pub const ALUA_UNAVAILABLE: Self = Self::new(0x04, 0x0C);
    /// 2A/06 ASYMMETRIC ACCESS STATE CHANGED.
    pub const ASYMMETRIC_ACCESS_STATE_CHANGED: Self = Self::new(0x2A, 0x06);
    /// 55/04 INSUFFICIENT REGISTRATION RESOURCES.
    pub const INSUFFICIENT_REGISTRATION_RESOURCES: Self = Self::new(0x55, 0x04);

    /// An ASC/ASCQ pair.
    pub const fn new(asc: u8, ascq: u8) -> Self {
        Self { asc, ascq }
    }

    /// What the pair means in words: T10's name where the table holds it,
    /// the vendor-specific ranges (ASC 80h-FFh, or ASCQ 80h-FFh under a
    /// standard ASC, SPC-4 §4.5.2.1) named as such, `None` for any other
    /// pair.
    pub fn description(self) -> Option<&'static str> {
        if self.asc >= 0x80 {
            return Some("Vendor specific");
        }
        if let Some(name) = asc_names::name(self.asc, self.ascq) {
            return Some(name);
        }
        match self.asc {
            // 4Dh/NNh: the ASCQ is the tag of the task that overlapped.
            0x4D => Some("Tagged overlapped commands (ASCQ holds the task tag)"),
            _ if self.ascq >= 0x80 => Some("Vendor specific qualifier"),
            _ => None,
        }
    }
}

/// The words first, then the numbers ("Logical unit not supported (ASC
/// 0x25, ASCQ 0x00)"): the numbers are what a vendor's manual and T10's list
/// are searched by. A pair with no description prints as its numbers alone.
impl fmt::Display for Asc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let codes = format_args!("ASC 0x{:02X}, ASCQ 0x{:02X}", self.asc, self.ascq);
        match self.description() {
            Some(words) => write!(f, "{words} ({codes})"),
            None => write!(f, "{codes}"),
        }
    }
}

/// Which field of the CDB or parameter list an ILLEGAL REQUEST is about:
/// the field pointer sense-key specific data (SPC-4 §4.5.2.4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FieldPointer {
    /// The field is in the CDB (C/D = 1), not in the parameter list.
    pub in_cdb: bool,
    /// The byte the field is in.
    pub byte: u16,
    /// The field's most significant bit in that byte (BPV = 1), when the
    /// field does not start a byte.
    pub bit: Option<u8>,
}

impl FieldPointer {
    /// A field of the CDB: `byte`, and `bit` when it does not start the byte.
    pub const fn cdb(byte: u16, bit: Option<u8>) -> Self {
        Self {
            in_cdb: true,
            byte,
            bit,
        }
    }

    /// A field of the parameter list (Data-Out): `byte`, and `bit` when it
    /// does not start the byte.
    pub const fn param(byte: u16, bit: Option<u8>) -> Self {
        Self {
            in_cdb: false,
            byte,
            bit,
        }
    }

    /// The three sense-key specific bytes: SKSV, C/D, BPV, BIT POINTER,
    /// FIELD POINTER.
    const fn bytes(self) -> [u8; 3] {
        let mut first = 0x80;
        if self.in_cdb {
            first |= 0x40;
        }
        if let Some(bit) = self.bit {
            first |= 0x08 | (bit & 0x07);
        }
        let pointer = self.byte.to_be_bytes();
        [first, pointer[0], pointer[1]]
    }
}

/// Sense data for one CHECK CONDITION (or for REQUEST SENSE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sense {
    /// The sense key.
    pub key: SenseKey,
    /// The additional sense code and qualifier.
    pub asc: Asc,
    /// The INFORMATION field (VALID bit set), e.g. the offset of the first
    /// miscompared byte (SBC-3 §5.2, §5.33).
    pub information: Option<u64>,
    /// The field an ILLEGAL REQUEST is about, if named.
    pub field_pointer: Option<FieldPointer>,
    /// PROGRESS INDICATION (SPC-4 §4.5.2.4.4): how much of a long
    /// operation (SANITIZE) is done, in 65536ths; sent as sense-key
    /// specific data when there is no field pointer.
    pub progress: Option<u16>,
}

/// The key and the additional sense, e.g. "Illegal Request: Logical unit
/// not supported (ASC 0x25, ASCQ 0x00)" (INFORMATION and the field pointer
/// are left to whoever needs them).
impl fmt::Display for Sense {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.asc)
    }
}

/// Length of the fixed-format sense data [`Sense::to_fixed_format`] produces.
pub const FIXED_SENSE_LEN: usize = 18;

impl Sense {
    /// Sense data from a key and an ASC/ASCQ pair.
    pub const fn new(key: SenseKey, asc: Asc) -> Self {
        Self {
            key,
            asc,
            information: None,
            field_pointer: None,
            progress: None,
        }
    }

    /// The same sense with a progress indication (`done` in 65536ths).
    pub const fn with_progress(self, done: u16) -> Self {
        Self {
            progress: Some(done),
            ..self
        }
    }

    /// The sense-key specific bytes: a field pointer, else a progress
    /// indication (SKSV set in both).
    const fn key_specific(&self) -> Option<[u8; 3]> {
        match (self.field_pointer, self.progress) {
            (Some(field), _) => Some(field.bytes()),
            (None, Some(p)) => {
                let p = p.to_be_bytes();
                Some([0x80, p[0], p[1]])
            }
            (None, None) => None,
        }
    }

    /// The same sense naming the offending field.
    pub const fn with_field_pointer(self, field: FieldPointer) -> Self {
        Self {
            field_pointer: Some(field),
            ..self
        }
    }

    /// The same sense with the INFORMATION field set to `info`.
    pub const fn with_information(self, info: u64) -> Self {
        Self {
            information: Some(info),
            ..self
        }
    }

    /// MISCOMPARE / MISCOMPARE DURING VERIFY OPERATION with the offset of
    /// the first differing byte in INFORMATION (COMPARE AND WRITE, VERIFY).
    pub const fn miscompare(offset: u64) -> Self {
        Self::new(SenseKey::Miscompare, Asc::MISCOMPARE_DURING_VERIFY).with_information(offset)
    }

    /// UNIT ATTENTION with `asc`.
    pub const fn unit_attention(asc: Asc) -> Self {
        Self::new(SenseKey::UnitAttention, asc)
    }

    /// Whether this is a unit attention condition.
    pub fn is_unit_attention(&self) -> bool {
        self.key == SenseKey::UnitAttention
    }

    /// The sense data in fixed format or, with `descriptor` (the control
    /// mode page's D_SENSE bit), descriptor format.
    pub fn encode(&self, descriptor: bool) -> Vec<u8> {
        if descriptor {
            self.to_descriptor_format()
        } else {
            self.to_fixed_format().to_vec()
        }
    }

    /// "No sense": what REQUEST SENSE returns when nothing is pending.
    pub const NO_SENSE: Self = Self::new(SenseKey::NoSense, Asc::NO_ADDITIONAL_SENSE);

    /// ILLEGAL REQUEST / INVALID COMMAND OPERATION CODE.
    pub const INVALID_OPCODE: Self = Self::new(
        SenseKey::IllegalRequest,
        Asc::INVALID_COMMAND_OPERATION_CODE,
    );
    /// ILLEGAL REQUEST / INVALID FIELD IN CDB.
    pub const INVALID_FIELD_IN_CDB: Self =
        Self::new(SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB);
    /// ILLEGAL REQUEST / LOGICAL BLOCK ADDRESS OUT OF RANGE.
    pub const LBA_OUT_OF_RANGE: Self = Self::new(SenseKey::IllegalRequest, Asc::LBA_OUT_OF_RANGE);
    /// ILLEGAL REQUEST / LOGICAL UNIT NOT SUPPORTED.
    pub const LUN_NOT_SUPPORTED: Self =
        Self::new(SenseKey::IllegalRequest, Asc::LOGICAL_UNIT_NOT_SUPPORTED);
    /// ILLEGAL REQUEST / INVALID FIELD IN PARAMETER LIST.
    pub const INVALID_FIELD_IN_PARAMETER_LIST: Self = Self::new(
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
    );
    /// ILLEGAL REQUEST / PARAMETER LIST LENGTH ERROR.
    pub const PARAMETER_LIST_LENGTH_ERROR: Self =
        Self::new(SenseKey::IllegalRequest, Asc::PARAMETER_LIST_LENGTH_ERROR);
    /// ILLEGAL REQUEST / SAVING PARAMETERS NOT SUPPORTED.
    pub const SAVING_PARAMETERS_NOT_SUPPORTED: Self = Self::new(
        SenseKey::IllegalRequest,
        Asc::SAVING_PARAMETERS_NOT_SUPPORTED,
    );
    /// MEDIUM ERROR / UNRECOVERED READ ERROR (a backstore read failed).
    pub const READ_ERROR: Self = Self::new(SenseKey::MediumError, Asc::UNRECOVERED_READ_ERROR);
    /// MEDIUM ERROR / WRITE ERROR (a backstore write or flush failed).
    pub const WRITE_ERROR: Self = Self::new(SenseKey::MediumError, Asc::WRITE_ERROR);
    /// NOT READY / LOGICAL UNIT COMMUNICATION FAILURE (the medium is
    /// behind a network, and this gateway may no longer reach it).
    pub const LU_COMMUNICATION_FAILURE: Self =
        Self::new(SenseKey::NotReady, Asc::LU_COMMUNICATION_FAILURE);
    /// NOT READY / LOGICAL UNIT COMMUNICATION TIME-OUT (the medium is
    /// behind a network that did not answer in the configured time).
    pub const LU_COMMUNICATION_TIMEOUT: Self =
        Self::new(SenseKey::NotReady, Asc::LU_COMMUNICATION_TIMEOUT);

    /// The sense for a failed backstore call: `fallback` (READ_ERROR or
    /// WRITE_ERROR, per the command) unless the error says the medium was
    /// not reached rather than that it failed. The difference matters to
    /// the initiator: a MEDIUM ERROR is final (Linux fails the I/O up),
    /// while NOT READY tells it to retry or to try another path, which is
    /// what a cluster that is briefly gone, or a gateway fenced in favour
    /// of another, needs. By errno, so that every backstore shares it:
    /// - ETIMEDOUT: LOGICAL UNIT COMMUNICATION TIME-OUT (an RBD op ran
    ///   past the store's `timeout=`; it may or may not have landed, which
    ///   the initiator's retry of the same write makes harmless);
    /// - ESHUTDOWN (Ceph's EBLOCKLISTED), ENOTCONN: LOGICAL UNIT
    ///   COMMUNICATION FAILURE (this client was fenced); EAGAIN too (a
    ///   fenced store rejoining: where the SCSI layer can, it answers BUSY
    ///   instead, which initiators retry);
    /// - ENOENT, ENODEV: MEDIUM NOT PRESENT (the medium itself is gone,
    ///   e.g. an RBD image removed: SPC-4 says "not ready, medium not
    ///   present" for a LU that exists with no medium, which keeps the LU
    ///   in REPORT LUNS consistent; LOGICAL UNIT NOT SUPPORTED would say
    ///   the LUN does not exist at all).
    pub fn for_io_error(error: &std::io::Error, fallback: Self) -> Self {
        const ENOENT: i32 = 2;
        const EAGAIN: i32 = 11;
        const ENODEV: i32 = 19;
        const ENOTCONN: i32 = 107;
        const ESHUTDOWN: i32 = 108;
        const ETIMEDOUT: i32 = 110;
        match error.raw_os_error() {
            Some(ETIMEDOUT) => Self::LU_COMMUNICATION_TIMEOUT,
            Some(ESHUTDOWN | ENOTCONN | EAGAIN) => Self::LU_COMMUNICATION_FAILURE,
            Some(ENOENT | ENODEV) => Self::MEDIUM_NOT_PRESENT,
            _ => match error.kind() {
                std::io::ErrorKind::TimedOut => Self::LU_COMMUNICATION_TIMEOUT,
                std::io::ErrorKind::WouldBlock => Self::LU_COMMUNICATION_FAILURE,
                std::io::ErrorKind::NotFound => Self::MEDIUM_NOT_PRESENT,
                _ => fallback,
            },
        }
    }

    /// [`Sense::for_io_error`] with [`Sense::READ_ERROR`] as the fallback.
    pub fn read_failed(error: std::io::Error) -> Self {
        Self::for_io_error(&error, Self::READ_ERROR)
    }

    /// [`Sense::for_io_error`] with [`Sense::WRITE_ERROR`] as the fallback.
    pub fn write_failed(error: std::io::Error) -> Self {
        Self::for_io_error(&error, Self::WRITE_ERROR)
    }

    /// UNIT ATTENTION / POWER ON, RESET, OR BUS DEVICE RESET OCCURRED.
    pub const POWER_ON_RESET: Self = Self::new(SenseKey::UnitAttention, Asc::POWER_ON_RESET);
    /// UNIT ATTENTION / MODE PARAMETERS CHANGED.
    pub const MODE_PARAMETERS_CHANGED: Self =
        Self::new(SenseKey::UnitAttention, Asc::MODE_PARAMETERS_CHANGED);
    /// DATA PROTECT / WRITE PROTECTED (SWP set in the control mode page).
    pub const WRITE_PROTECTED: Self = Self::new(SenseKey::DataProtect, Asc::WRITE_PROTECTED);
    /// NOT READY / MEDIUM NOT PRESENT.
    pub const MEDIUM_NOT_PRESENT: Self = Self::new(SenseKey::NotReady, Asc::MEDIUM_NOT_PRESENT);
    /// ILLEGAL REQUEST / MEDIUM REMOVAL PREVENTED (an eject while an I_T
    /// nexus prevents it, SBC-3 §5.25).
    pub const MEDIUM_REMOVAL_PREVENTED: Self =
        Self::new(SenseKey::IllegalRequest, Asc::MEDIUM_REMOVAL_PREVENTED);
    /// UNIT ATTENTION / NOT READY TO READY CHANGE, MEDIUM MAY HAVE CHANGED
    /// (a medium was loaded).
    pub const MEDIUM_MAY_HAVE_CHANGED: Self =
        Self::new(SenseKey::UnitAttention, Asc::MEDIUM_MAY_HAVE_CHANGED);

    /// Fixed-format sense data (SPC-4 §4.5.3): response code 0x70 (current
    /// error), sense key in byte 2, additional sense length 10, ASC/ASCQ in
    /// bytes 12/13; an INFORMATION value that fits in 32 bits goes in bytes
    /// 3-6 with the VALID bit, a field pointer in bytes 15-17.
    pub fn to_fixed_format(&self) -> [u8; FIXED_SENSE_LEN] {
        let mut b = [0u8; FIXED_SENSE_LEN];
        b[0] = 0x70;
        if let Some(info) = self.information.and_then(|i| u32::try_from(i).ok()) {
            b[0] |= 0x80;
            b[3..7].copy_from_slice(&info.to_be_bytes());
        }
        b[2] = self.key.code();
        b[7] = (FIXED_SENSE_LEN - 8) as u8;
        b[12] = self.asc.asc;
        b[13] = self.asc.ascq;
        if let Some(sks) = self.key_specific() {
            b[15..18].copy_from_slice(&sks);
        }
        b
    }

    /// Descriptor-format sense data (SPC-4 §4.5.2): response code 0x72
    /// (current error), sense key, ASC, ASCQ, then an Information sense data
    /// descriptor (SPC-4 §4.5.2.2) when INFORMATION is set and a Sense key
    /// specific sense data descriptor (§4.5.2.4) for a field pointer.
    pub fn to_descriptor_format(&self) -> Vec<u8> {
        let mut v = vec![
            0x72,
            self.key.code(),
            self.asc.asc,
            self.asc.ascq,
            0,
            0,
            0,
            0,
        ];
        if let Some(info) = self.information {
            v.extend_from_slice(&[0x00, 0x0A, 0x80, 0x00]);
            v.extend_from_slice(&info.to_be_bytes());
        }
        if let Some([first, high, low]) = self.key_specific() {
            v.extend_from_slice(&[0x02, 0x06, 0x00, 0x00, first, high, low, 0x00]);
        }
        v[7] = (v.len() - 8) as u8;
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_layout() {
        let b = Sense::LBA_OUT_OF_RANGE.to_fixed_format();
        assert_eq!(b[0], 0x70);
        assert_eq!(b[2], 0x05);
        assert_eq!(b[7], 10);
        assert_eq!((b[12], b[13]), (0x21, 0x00));
    }

    #[test]
    fn field_pointer_in_both_formats() {
        let sense = Sense::INVALID_FIELD_IN_CDB.with_field_pointer(FieldPointer::cdb(2, Some(2)));
        let fixed = sense.to_fixed_format();
        // SKSV | C/D | BPV | bit 2, then field pointer 0x0002 (SPC-4 4.5.2.4.2).
        assert_eq!(fixed[15..18], [0xCA, 0x00, 0x02]);
        assert_eq!(fixed[7], 10);
        let descriptor = sense.to_descriptor_format();
        assert_eq!(
            descriptor,
            [
                0x72, 0x05, 0x24, 0x00, 0, 0, 0, 8, 0x02, 0x06, 0, 0, 0xCA, 0x00, 0x02, 0
            ]
        );
        let parameter = FieldPointer {
            in_cdb: false,
            byte: 300,
            bit: None,
        };
        let sense = Sense::INVALID_FIELD_IN_PARAMETER_LIST.with_field_pointer(parameter);
        assert_eq!(sense.to_fixed_format()[15..18], [0x80, 0x01, 0x2C]);
        let both = Sense::miscompare(7).with_field_pointer(parameter);
        let descriptor = both.to_descriptor_format();
        assert_eq!(descriptor[7] as usize, descriptor.len() - 8);
        assert_eq!(descriptor.len(), 8 + 12 + 8);
    }

    #[test]
    fn descriptor_layout() {
        let b = Sense::MODE_PARAMETERS_CHANGED.to_descriptor_format();
        assert_eq!(b, [0x72, 0x06, 0x2A, 0x01, 0, 0, 0, 0]);
    }

    /// The wording checked against sg3-utils' `sg_decode_sense` (1.48).
    #[test]
    fn words_first_then_codes() {
        assert_eq!(
            Sense::LUN_NOT_SUPPORTED.to_string(),
            "Illegal Request: Logical unit not supported (ASC 0x25, ASCQ 0x00)"
        );
        let nexus_loss = Sense::unit_attention(Asc::I_T_NEXUS_LOSS);
        assert_eq!(
            nexus_loss.to_string(),
            "Unit Attention: I_T nexus loss occurred (ASC 0x29, ASCQ 0x07)"
        );
        let cases = [
            (0x21, 0x00, "Logical block address out of range"),
            (0x24, 0x00, "Invalid field in cdb"),
            (
                0x04,
                0x02,
                "Logical unit not ready, initializing command required",
            ),
            (0x10, 0x01, "Logical block guard check failed"),
            (0x47, 0x05, "Protocol service CRC error"),
            (0x2A, 0x09, "Capacity data has changed"),
            (0x3F, 0x0E, "Reported luns data has changed"),
            (0x44, 0x00, "Internal target failure"),
            (0x55, 0x03, "Insufficient resources"),
            (0x5D, 0x00, "Failure prediction threshold exceeded"),
        ];
        for (asc, ascq, words) in cases {
            assert_eq!(Asc::new(asc, ascq).description(), Some(words));
        }
    }

    #[test]
    fn codes_alone_where_there_are_no_words() {
        assert_eq!(Asc::new(0x24, 0x50).to_string(), "ASC 0x24, ASCQ 0x50");
        assert_eq!(Asc::new(0x7E, 0x00).to_string(), "ASC 0x7E, ASCQ 0x00");
        assert_eq!(
            Asc::new(0x80, 0x01).to_string(),
            "Vendor specific (ASC 0x80, ASCQ 0x01)"
        );
        assert_eq!(
            Asc::new(0x24, 0x85).to_string(),
            "Vendor specific qualifier (ASC 0x24, ASCQ 0x85)"
        );
        assert_eq!(
            Asc::new(0x4D, 0x12).description(),
            Some("Tagged overlapped commands (ASCQ holds the task tag)")
        );
    }

    #[test]
    fn every_key_code_has_a_name() {
        for code in 0..=0xFF_u8 {
            let key = SenseKey::from_code(code);
            assert_eq!(key.code(), code & 0x0F);
            assert!(!key.name().is_empty());
        }
        assert_eq!(SenseKey::from_code(0x25), SenseKey::IllegalRequest);
    }

    #[test]
    fn spc4_values() {
        assert_eq!(Asc::INVALID_COMMAND_OPERATION_CODE, Asc::new(0x20, 0));
        assert_eq!(Asc::LBA_OUT_OF_RANGE, Asc::new(0x21, 0));
        assert_eq!(Asc::INVALID_FIELD_IN_CDB, Asc::new(0x24, 0));
        assert_eq!(Asc::LOGICAL_UNIT_NOT_SUPPORTED, Asc::new(0x25, 0));
        assert_eq!(Asc::MEDIUM_NOT_PRESENT, Asc::new(0x3A, 0));
        assert_eq!(Asc::POWER_ON_RESET, Asc::new(0x29, 0));
        assert_eq!(Asc::MODE_PARAMETERS_CHANGED, Asc::new(0x2A, 1));
        assert_eq!(Asc::LU_COMMUNICATION_FAILURE, Asc::new(0x08, 0));
        assert_eq!(Asc::LU_COMMUNICATION_TIMEOUT, Asc::new(0x08, 1));
    }

    #[test]
    fn io_errors_that_mean_unreachable_or_gone_are_not_medium_errors() {
        use std::io::{Error, ErrorKind};
        let sense = |e: Error| Sense::for_io_error(&e, Sense::READ_ERROR);
        let timeout = sense(Error::from_raw_os_error(110));
        assert_eq!(
            (timeout.key, timeout.asc),
            (SenseKey::NotReady, Asc::new(0x08, 1))
        );
        assert_eq!(sense(ErrorKind::TimedOut.into()), timeout);
        let fenced = sense(Error::from_raw_os_error(108));
        assert_eq!(
            (fenced.key, fenced.asc),
            (SenseKey::NotReady, Asc::new(0x08, 0))
        );
        assert_eq!(sense(Error::from_raw_os_error(11)), fenced);
        assert_eq!(sense(ErrorKind::WouldBlock.into()), fenced);
        let gone = sense(Error::from_raw_os_error(2));
        assert_eq!(
            (gone.key, gone.asc),
            (SenseKey::NotReady, Asc::new(0x3A, 0))
        );
        // Anything else is the command's own medium error.
        assert_eq!(sense(Error::from_raw_os_error(5)), Sense::READ_ERROR);
        assert_eq!(
            Sense::write_failed(ErrorKind::WriteZero.into()),
            Sense::WRITE_ERROR
        );
    }
}
