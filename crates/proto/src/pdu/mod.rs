//! iSCSI PDU framing (RFC 7143 section 11.2): the 48-byte Basic Header
//! Segment (BHS), Additional Header Segments (AHS, TotalAHSLength in 4-byte
//! words), the optional header digest after BHS+AHS, the data segment
//! (DataSegmentLength, 24 bits) padded to a multiple of 4 bytes, and the
//! optional data digest after data and padding (section 11.1).
//!
//! The folder holds the [`Opcode`] table and the BHS framing (`bhs.rs`), the
//! typed [`Pdu`] enum over every PDU family (`typed.rs`), the [`Header`]
//! (BHS + AHS + data length, `header.rs`) and the AHS codec (`ahs.rs`);
//! this file only names them.
//! Each PDU family's fields live in its own file: [`scsi`], [`data`],
//! [`task`], [`login`], [`text`], [`logout`], [`nop`], [`snack`],
//! [`async_msg`], [`reject`]. Sending is in [`encode`], receiving in
//! [`decoder`].
//!
//! Decoding is lenient where RFC 7143 says "reserved": reserved bits are
//! ignored and unknown code values are kept (`Other(u8)` variants), so a
//! higher layer decides how to answer them. Encoding writes reserved bits as
//! zero. [`Pdu::reserved_bits_clear`] tells whether a received BHS was
//! canonical (every reserved bit zero).

mod ahs;
pub mod async_msg;
mod bhs;
pub mod data;
pub mod decoder;
pub mod encode;
pub mod error;
mod header;
pub mod login;
pub mod logout;
pub mod nop;
pub mod reject;
pub mod scsi;
pub mod snack;
pub(crate) mod stage;
pub mod task;
pub mod text;
mod typed;

pub(crate) mod wire;

pub use ahs::Ahs;
pub use async_msg::{AsyncEvent, AsyncMessage};
pub use bhs::{
    DIGEST_LEN, Digests, Lun, MAX_AHS_LEN, MAX_DATA_SEGMENT_LENGTH, Opcode, RESERVED_TAG,
    SegmentLengths, padding_len,
};
pub use data::{DataIn, DataOut, ReadyToTransfer};
pub use decoder::{DecodedPdu, Decoder, DecoderConfig, Event, Need, Progress, Stage};
pub use encode::{DataTrailer, OutgoingPdu, encode_header, encode_pdu, encode_pdu_to_vec};
pub use header::Header;
pub use login::{
    Isid, IsidType, LoginRequest, LoginResponse, LoginStage, LoginStatus, StatusClass,
};
pub use logout::{LogoutReason, LogoutRequest, LogoutResponse, LogoutResponseCode};
pub use nop::{NopIn, NopOut};
pub use reject::{Reject, RejectReason};
pub use scsi::{ScsiCommand, ScsiResponse, ServiceResponse, TaskAttribute};
pub use snack::{SnackRequest, SnackType};
pub use task::{TaskFunction, TaskManagementRequest, TaskManagementResponse, TaskResponse};
pub use text::{TextRequest, TextResponse};
pub use typed::{Pdu, UnknownPdu};
pub use wire::BHS_LEN;
