//! [`Pdu`]: every PDU of RFC 7143 section 11 as the typed fields of its
//! BHS, one variant per family (each family's fields in its own file).

use super::async_msg::AsyncMessage;
use super::bhs::{Opcode, SegmentLengths};
use super::data::{DataIn, DataOut, ReadyToTransfer};
use super::login::{LoginRequest, LoginResponse};
use super::logout::{LogoutRequest, LogoutResponse};
use super::nop::{NopIn, NopOut};
use super::reject::Reject;
use super::scsi::{ScsiCommand, ScsiResponse};
use super::snack::SnackRequest;
use super::task::{TaskManagementRequest, TaskManagementResponse};
use super::text::{TextRequest, TextResponse};
use super::wire::{self, BHS_LEN};

/// A PDU whose opcode this crate does not interpret (vendor-specific or
/// reserved opcodes).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UnknownPdu {
    /// The BHS as received, with bytes 4-7 (the lengths) zeroed: the
    /// lengths are in [`SegmentLengths`]. A target answers it with a Reject
    /// "Command not supported" carrying the received header (section 11.17).
    pub bhs: Box<[u8; BHS_LEN]>,
}

/// Every PDU of RFC 7143 section 11, as the typed fields of its BHS.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Pdu {
    /// NOP-Out (section 11.18).
    NopOut(NopOut),
    /// SCSI Command (section 11.3).
    ScsiCommand(ScsiCommand),
    /// Task Management Function Request (section 11.5).
    TaskManagementRequest(TaskManagementRequest),
    /// Login Request (section 11.12).
    LoginRequest(LoginRequest),
    /// Text Request (section 11.10).
    TextRequest(TextRequest),
    /// SCSI Data-Out (section 11.7).
    DataOut(DataOut),
    /// Logout Request (section 11.14).
    LogoutRequest(LogoutRequest),
    /// SNACK Request (section 11.16).
    SnackRequest(SnackRequest),
    /// NOP-In (section 11.19).
    NopIn(NopIn),
    /// SCSI Response (section 11.4).
    ScsiResponse(ScsiResponse),
    /// Task Management Function Response (section 11.6).
    TaskManagementResponse(TaskManagementResponse),
    /// Login Response (section 11.13).
    LoginResponse(LoginResponse),
    /// Text Response (section 11.11).
    TextResponse(TextResponse),
    /// SCSI Data-In (section 11.7).
    DataIn(DataIn),
    /// Logout Response (section 11.15).
    LogoutResponse(LogoutResponse),
    /// Ready To Transfer (section 11.8).
    ReadyToTransfer(ReadyToTransfer),
    /// Asynchronous Message (section 11.9).
    AsyncMessage(AsyncMessage),
    /// Reject (section 11.17).
    Reject(Reject),
    /// A vendor-specific or reserved opcode.
    Unknown(UnknownPdu),
}

impl Pdu {
    /// This PDU's opcode.
    pub fn opcode(&self) -> Opcode {
        match self {
            Pdu::NopOut(_) => Opcode::NopOut,
            Pdu::ScsiCommand(_) => Opcode::ScsiCommand,
            Pdu::TaskManagementRequest(_) => Opcode::TaskManagementRequest,
            Pdu::LoginRequest(_) => Opcode::LoginRequest,
            Pdu::TextRequest(_) => Opcode::TextRequest,
            Pdu::DataOut(_) => Opcode::ScsiDataOut,
            Pdu::LogoutRequest(_) => Opcode::LogoutRequest,
            Pdu::SnackRequest(_) => Opcode::SnackRequest,
            Pdu::NopIn(_) => Opcode::NopIn,
            Pdu::ScsiResponse(_) => Opcode::ScsiResponse,
            Pdu::TaskManagementResponse(_) => Opcode::TaskManagementResponse,
            Pdu::LoginResponse(_) => Opcode::LoginResponse,
            Pdu::TextResponse(_) => Opcode::TextResponse,
            Pdu::DataIn(_) => Opcode::ScsiDataIn,
            Pdu::LogoutResponse(_) => Opcode::LogoutResponse,
            Pdu::ReadyToTransfer(_) => Opcode::ReadyToTransfer,
            Pdu::AsyncMessage(_) => Opcode::AsyncMessage,
            Pdu::Reject(_) => Opcode::Reject,
            Pdu::Unknown(u) => Opcode::from_bits(u.bhs[0]),
        }
    }

    /// The Initiator Task Tag (BHS bytes 16-19, section 11.2.1.8), for every
    /// PDU (0xffffffff where the PDU's format fixes it so).
    pub fn initiator_task_tag(&self) -> u32 {
        match self {
            Pdu::Unknown(u) => wire::u32_at(&u.bhs, 16),
            other => {
                let mut bhs = [0u8; BHS_LEN];
                other.encode_bhs(SegmentLengths::default(), &mut bhs);
                wire::u32_at(&bhs, 16)
            }
        }
    }

    /// Decodes a Basic Header Segment. Never fails: unknown opcodes become
    /// [`Pdu::Unknown`], unknown codes are kept, reserved bits are ignored.
    pub fn decode_bhs(bhs: &[u8; BHS_LEN]) -> (Pdu, SegmentLengths) {
        let lengths = SegmentLengths::of_bhs(bhs);
        let pdu = match Opcode::from_bits(bhs[0]) {
            Opcode::NopOut => Pdu::NopOut(NopOut::decode(bhs)),
            Opcode::ScsiCommand => Pdu::ScsiCommand(ScsiCommand::decode(bhs)),
            Opcode::TaskManagementRequest => {
                Pdu::TaskManagementRequest(TaskManagementRequest::decode(bhs))
            }
            Opcode::LoginRequest => Pdu::LoginRequest(LoginRequest::decode(bhs)),
            Opcode::TextRequest => Pdu::TextRequest(TextRequest::decode(bhs)),
            Opcode::ScsiDataOut => Pdu::DataOut(DataOut::decode(bhs)),
            Opcode::LogoutRequest => Pdu::LogoutRequest(LogoutRequest::decode(bhs)),
            Opcode::SnackRequest => Pdu::SnackRequest(SnackRequest::decode(bhs)),
            Opcode::NopIn => Pdu::NopIn(NopIn::decode(bhs)),
            Opcode::ScsiResponse => Pdu::ScsiResponse(ScsiResponse::decode(bhs)),
            Opcode::TaskManagementResponse => {
                Pdu::TaskManagementResponse(TaskManagementResponse::decode(bhs))
            }
            Opcode::LoginResponse => Pdu::LoginResponse(LoginResponse::decode(bhs)),
            Opcode::TextResponse => Pdu::TextResponse(TextResponse::decode(bhs)),
            Opcode::ScsiDataIn => Pdu::DataIn(DataIn::decode(bhs)),
            Opcode::LogoutResponse => Pdu::LogoutResponse(LogoutResponse::decode(bhs)),
            Opcode::ReadyToTransfer => Pdu::ReadyToTransfer(ReadyToTransfer::decode(bhs)),
            Opcode::AsyncMessage => Pdu::AsyncMessage(AsyncMessage::decode(bhs)),
            Opcode::Reject => Pdu::Reject(Reject::decode(bhs)),
            Opcode::VendorInitiator(_) | Opcode::VendorTarget(_) | Opcode::Reserved(_) => {
                let mut raw = Box::new(*bhs);
                raw[4..8].fill(0);
                Pdu::Unknown(UnknownPdu { bhs: raw })
            }
        };
        (pdu, lengths)
    }

    /// Encodes this PDU's BHS into `out`, with the framing `lengths` in
    /// bytes 4-7 (DataSegmentLength is masked to 24 bits; [`encode_header`]
    /// checks it first). Reserved bits are written as zero.
    pub fn encode_bhs(&self, lengths: SegmentLengths, out: &mut [u8; BHS_LEN]) {
        *out = [0; BHS_LEN];
        match self {
            Pdu::NopOut(p) => p.encode(out),
            Pdu::ScsiCommand(p) => p.encode(out),
            Pdu::TaskManagementRequest(p) => p.encode(out),
            Pdu::LoginRequest(p) => p.encode(out),
            Pdu::TextRequest(p) => p.encode(out),
            Pdu::DataOut(p) => p.encode(out),
            Pdu::LogoutRequest(p) => p.encode(out),
            Pdu::SnackRequest(p) => p.encode(out),
            Pdu::NopIn(p) => p.encode(out),
            Pdu::ScsiResponse(p) => p.encode(out),
            Pdu::TaskManagementResponse(p) => p.encode(out),
            Pdu::LoginResponse(p) => p.encode(out),
            Pdu::TextResponse(p) => p.encode(out),
            Pdu::DataIn(p) => p.encode(out),
            Pdu::LogoutResponse(p) => p.encode(out),
            Pdu::ReadyToTransfer(p) => p.encode(out),
            Pdu::AsyncMessage(p) => p.encode(out),
            Pdu::Reject(p) => p.encode(out),
            Pdu::Unknown(u) => *out = *u.bhs,
        }
        out[4] = lengths.total_ahs_words;
        wire::put_u24(out, 5, lengths.data_segment_length);
    }

    /// Whether every reserved bit of `bhs` is zero and every fixed field
    /// holds its fixed value, i.e. re-encoding the decoded PDU gives the same
    /// bytes. RFC 7143 (section 11.2.1) lets a receiver ignore reserved bits;
    /// this is for stricter checking and for tests.
    pub fn reserved_bits_clear(bhs: &[u8; BHS_LEN]) -> bool {
        let (pdu, lengths) = Pdu::decode_bhs(bhs);
        let mut again = [0u8; BHS_LEN];
        pdu.encode_bhs(lengths, &mut again);
        again == *bhs
    }
}
