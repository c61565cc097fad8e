//! iSER portals (RFC 7145): the RDMA stream a connection starts with, and
//! what login negotiates differently on it.
//!
//! The order is the one Linux's ib_iser and isert, and libiscsi, use: the
//! MPA Request/Reply first (its private data carries the iSER CM header),
//! then the whole login in iSER-assisted mode, over RDMA Sends. A peer that
//! opens with an iSER Hello instead is answered by the datamover.

use std::time::Duration;

use iscsi_datamover::iser::{CmHeader, IserConfig, IserDatamover, IserRole};
use iscsi_datamover::{Datamover, DatamoverError};
use iscsi_iwarp::{ConnectParams, QpCaps};
use iscsi_proto::login::target::{LoginPolicy, LoginRefusal, SessionRequest, TargetSettings};
use iscsi_proto::text::{Digest, TextPair};
use tokio::net::TcpStream;
use tracing::info;

/// How long a peer has to send its MPA Request.
const MPA_TIMEOUT: Duration = Duration::from_secs(10);
/// The TargetRecvDataSegmentLength this target declares: the data a
/// control-type PDU from the initiator may carry (immediate data, text).
/// Every receive buffer holds this much.
pub(crate) const RECV_DATA_SEGMENT_LENGTH: u32 = 8192;
/// RDMA Read Requests the target keeps outstanding (its ORD), at most; the
/// initiator's IRD bounds it further.
const ORD: u16 = 16;
/// RDMA Read Requests the target accepts (its IRD): the target never needs
/// to be read from, but a zero IRD is refused by some peers.
const IRD: u16 = 1;

/// The iSER datamover's errors, as the driver reports them.
fn rdma(error: iscsi_iwarp::Error) -> DatamoverError {
    DatamoverError::Transport(error.to_string())
}

/// Accepts the RDMA stream on a connection to an iSER portal: reads the
/// MPA Request, checks the initiator's iSER CM header, replies, and wraps
/// the queue pair as the connection's datamover, with receive buffers for
/// `command_window` commands in flight and room for the rest.
pub(crate) async fn accept(
    stream: TcpStream,
    command_window: u32,
) -> Result<Datamover, DatamoverError> {
    let request = iscsi_iwarp::accept_request(stream, MPA_TIMEOUT)
        .await
        .map_err(rdma)?;
    let peer = request.peer().clone();
    let cm = CmHeader::parse(&peer.private_data);
    if cm.zero_based {
        // Tagged offsets relative to the buffer: not implemented here (the
        // Linux initiator and libiscsi both say they do not support it).
        let _ = request.reject(&CmHeader::ours(false).emit()).await;
        return Err(DatamoverError::Transport(
            "the initiator asks for zero-based virtual addressing".into(),
        ));
    }
    let config = IserConfig {
        recv_data_segment_length: RECV_DATA_SEGMENT_LENGTH,
        // Every command may come with an immediate PDU or two beside it
        // (NOP-Out, task management): the window plus room for those.
        receives: command_window as usize + 64,
        send_with_invalidate: cm.send_with_invalidate,
        send_queue: 1024,
    };
    let params = ConnectParams {
        private_data: CmHeader::ours(cm.send_with_invalidate).emit().to_vec(),
        ird: IRD.max(peer.ord),
        ord: ORD.min(peer.ird),
        crc: true,
        caps: QpCaps {
            max_send_wr: config.send_queue,
            max_recv_wr: config.receives,
        },
        timeout: MPA_TIMEOUT,
    };
    let qp = request
        .accept(params, config.initial_receives())
        .await
        .map_err(rdma)?;
    info!(
        peer = %qp.peer_addr(),
        crc = qp.peer().crc,
        initiator_ird = peer.ird,
        initiator_ord = peer.ord,
        send_with_invalidate = cm.send_with_invalidate,
        "iSER connection: RDMA stream up"
    );
    Ok(Datamover::iser(IserDatamover::new(
        qp,
        IserRole::Target,
        config,
    )))
}

/// The login decisions on one connection: the target's own, and on an
/// iSER connection what RFC 7145 section 6 changes: `RDMAExtensions=Yes`,
/// no digests (the MPA CRC protects the data), `InitialR2T=Yes` (write
/// data beyond the immediate data is fetched with RDMA Reads, so the
/// initiator sends no unsolicited Data-Out that the receive buffers would
/// have to hold), and TargetRecvDataSegmentLength declared.
pub(crate) struct ConnectionPolicy<'a, P> {
    /// The target's policy.
    pub inner: &'a P,
    /// The connection is an iSER one.
    pub iser: bool,
}

impl<P: LoginPolicy> LoginPolicy for ConnectionPolicy<'_, P> {
    fn settings(&self, request: &SessionRequest) -> Result<TargetSettings, LoginRefusal> {
        let mut settings = self.inner.settings(request)?;
        if self.iser {
            let negotiation = &mut settings.negotiation;
            negotiation.rdma_extensions = true;
            negotiation.header_digest = vec![Digest::None];
            negotiation.data_digest = vec![Digest::None];
            negotiation.initial_r2t = true;
            negotiation.max_recv_data_segment_length = RECV_DATA_SEGMENT_LENGTH;
            negotiation.declarations.push(TextPair::new(
                "TargetRecvDataSegmentLength",
                RECV_DATA_SEGMENT_LENGTH.to_string(),
            ));
        }
        Ok(settings)
    }
}
