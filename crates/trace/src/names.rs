//! Names for what a trace shows: iSCSI PDUs by opcode (RFC 7143 section
//! 11) and SCSI commands by operation code (SPC-4, SBC-3), as a reader of
//! Perfetto's timeline or of `trace-report`'s table expects to see them.

use std::borrow::Cow;

use iscsi_proto::pdu::Opcode;

/// A PDU's name, e.g. "SCSI Command" or "Data-In".
pub fn pdu_name(opcode: Opcode) -> Cow<'static, str> {
    Cow::Borrowed(match opcode {
        Opcode::NopOut => "NOP-Out",
        Opcode::ScsiCommand => "SCSI Command",
        Opcode::TaskManagementRequest => "Task Management Request",
        Opcode::LoginRequest => "Login Request",
        Opcode::TextRequest => "Text Request",
        Opcode::ScsiDataOut => "Data-Out",
        Opcode::LogoutRequest => "Logout Request",
        Opcode::SnackRequest => "SNACK Request",
        Opcode::NopIn => "NOP-In",
        Opcode::ScsiResponse => "SCSI Response",
        Opcode::TaskManagementResponse => "Task Management Response",
        Opcode::LoginResponse => "Login Response",
        Opcode::TextResponse => "Text Response",
        Opcode::ScsiDataIn => "Data-In",
        Opcode::LogoutResponse => "Logout Response",
        Opcode::ReadyToTransfer => "R2T",
        Opcode::AsyncMessage => "Asynchronous Message",
        Opcode::Reject => "Reject",
        other => return Cow::Owned(format!("opcode 0x{:02x}", other.to_bits())),
    })
}

/// A SCSI command's name by its CDB's operation code, e.g. "READ(10)";
/// opcodes without a name here show as "SCSI 0x..".
pub fn cdb_name(opcode: u8) -> Cow<'static, str> {
    Cow::Borrowed(match opcode {
        0x00 => "TEST UNIT READY",
        0x03 => "REQUEST SENSE",
        0x08 => "READ(6)",
        0x0a => "WRITE(6)",
        0x12 => "INQUIRY",
        0x15 => "MODE SELECT(6)",
        0x16 => "RESERVE(6)",
        0x17 => "RELEASE(6)",
        0x1a => "MODE SENSE(6)",
        0x1b => "START STOP UNIT",
        0x1e => "PREVENT ALLOW MEDIUM REMOVAL",
        0x25 => "READ CAPACITY(10)",
        0x28 => "READ(10)",
        0x2a => "WRITE(10)",
        0x2e => "WRITE AND VERIFY(10)",
        0x2f => "VERIFY(10)",
        0x34 => "PRE-FETCH(10)",
        0x35 => "SYNCHRONIZE CACHE(10)",
        0x41 => "WRITE SAME(10)",
        0x42 => "UNMAP",
        0x55 => "MODE SELECT(10)",
        0x56 => "RESERVE(10)",
        0x57 => "RELEASE(10)",
        0x5a => "MODE SENSE(10)",
        0x5e => "PERSISTENT RESERVE IN",
        0x5f => "PERSISTENT RESERVE OUT",
        0x88 => "READ(16)",
        0x89 => "COMPARE AND WRITE",
        0x8a => "WRITE(16)",
        0x8e => "WRITE AND VERIFY(16)",
        0x8f => "VERIFY(16)",
        0x90 => "PRE-FETCH(16)",
        0x91 => "SYNCHRONIZE CACHE(16)",
        0x93 => "WRITE SAME(16)",
        0x9e => "SERVICE ACTION IN(16)",
        0xa0 => "REPORT LUNS",
        0xa3 => "MAINTENANCE IN",
        0xa8 => "READ(12)",
        0xaa => "WRITE(12)",
        other => return Cow::Owned(format!("SCSI 0x{other:02x}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_and_unknown_codes_are_named() {
        assert_eq!(pdu_name(Opcode::ScsiDataIn), "Data-In");
        assert_eq!(pdu_name(Opcode::Reserved(0x3b)), "opcode 0x3b");
        assert_eq!(cdb_name(0x28), "READ(10)");
        assert_eq!(cdb_name(0xc0), "SCSI 0xc0");
    }
}
