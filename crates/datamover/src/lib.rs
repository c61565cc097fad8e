//! The datamover seam of iscsi-rs (RFC 5047, "Datamover Architecture for
//! iSCSI"): the primitives the iSCSI layer — target and initiator alike —
//! uses to move control PDUs and data, kept apart from any transport so that
//! plain TCP and, later, iSER over RDMA (RFC 7145) are two implementations of
//! the same interface.
//!
//! | RFC 5047 primitive | here |
//! |---|---|
//! | `Send_Control` (a control PDU, with any immediate or unsolicited data) | [`PduSender::send_control`] |
//! | `Put_Data` (target: SCSI data towards the initiator) | [`PduSender::put_data`] |
//! | `Get_Data` (target: fetch solicited data; over TCP an R2T answered by Data-Out) | [`PduSender::send_control`] of the R2T, then [`PduReceiver::receive_data_into`] |
//! | `Control_Notify` (a control PDU arrived) | [`PduReceiver::receive_header`] / [`PduReceiver::receive`] |
//! | `Data_Completion_Notify` (all data of a task placed) | the caller's data tracker (`iscsi_proto::transfer`) after [`PduReceiver::receive_data_into`] |
//! | `Notice_Key_Values` / `Enable_Datamover` (the login result switches the connection to full feature phase) | [`tcp::TcpDatamover::enable`] |
//! | `Allocate_Connection_Resources` / `Deallocate_Connection_Resources` | [`tcp::TcpDatamover::new`] / dropping it |
//! | `Connection_Terminate` / `Connection_Terminate_Notify` | [`PduSender::terminate`] / a receive returning `Ok(None)` or an error |
//!
//! The two directions are separate objects ([`PduReceiver`], [`PduSender`])
//! so a connection can read and write from different tasks: the target keeps
//! receiving Data-Out and new commands while earlier commands' Data-In is
//! being written.
//!
//! | module | owns |
//! |---|---|
//! | `lib.rs` | this table and the exports: no module imports the crate root |
//! | `primitives.rs` | the primitive traits ([`PduReceiver`], [`PduSender`]), [`Received`] and [`DatamoverError`] |
//! | `buffers.rs` | [`BufferPool`]: data buffers reused from command to command, LIFO, by both sides |
//! | [`tap`] | [`tap::WireTap`]: told of every PDU sent and received (counters for parameter studies, traces) |
//! | [`iser`] | the iSER datamover (RFC 7145) over the verbs of `iscsi-iwarp`: control PDUs in RDMA Sends, Data-In as RDMA Writes, R2T/Data-Out as RDMA Reads |
//! | `write_buffer.rs` | [`WriteBuffer`]: a target's write data in one buffer or in pieces of the store's chunk size, received in place |
//! | `transport.rs` | [`Datamover`], [`Receiver`], [`Sender`]: one connection's datamover, TCP or iSER, behind the same primitives |
//! | [`tcp`] | the TCP datamover (RFC 7143 framing over a byte stream): streaming receive into caller buffers with the data digest computed per chunk while hot, vectored sends with no copy of the data segment |

mod buffers;
mod gather;
pub mod iser;
mod primitives;
pub mod tap;
pub mod tcp;
mod transport;
mod write_buffer;

pub use buffers::{BufferPool, PooledBuffer};
pub use gather::{Gather, PieceCrc};
pub use primitives::{DatamoverError, PduReceiver, PduSender, Received};
pub use transport::{Datamover, Receiver, Sender};
pub use write_buffer::{WRITE_PIECE, WriteBuffer};
