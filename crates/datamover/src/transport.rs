//! One connection's datamover, whichever transport carries it: the TCP
//! datamover or the iSER one. The iSCSI layer holds these and calls the
//! RFC 5047 primitives; only [`Datamover::rdma_capable`] tells it anything
//! of the transport, because login must negotiate `RDMAExtensions=Yes` on
//! an RDMA-capable connection (RFC 7145 section 5.1).

use std::net::SocketAddr;

use iscsi_proto::pdu::{Digests, Header};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use crate::iser::{DataDescriptors, IserDatamover, IserReceiver, IserSender};
use crate::primitives::{DatamoverError, PduReceiver, PduSender};
use crate::tap::Tap;
use crate::tcp::{PduBatch, StreamReceiver, StreamSender, TcpDatamover};

/// The receive direction of a connection.
#[derive(Debug)]
pub enum Receiver {
    /// RFC 7143 framing over TCP.
    Tcp(StreamReceiver<OwnedReadHalf>),
    /// iSER over an RDMA stream.
    Iser(IserReceiver),
}

/// The send direction of a connection.
#[derive(Debug)]
pub enum Sender {
    /// RFC 7143 framing over TCP.
    Tcp(StreamSender<OwnedWriteHalf>),
    /// iSER over an RDMA stream.
    Iser(IserSender),
}

impl Receiver {
    /// Ends the connection both ways at once, whatever is under way on it:
    /// over TCP, a shutdown of the socket. A send waiting for a peer that
    /// stopped reading (its window shut) then fails rather than wait for
    /// good, and the peer is told even while the send direction's half is
    /// still held elsewhere (dropping one half of a socket closes
    /// nothing). Over iSER nothing: its stream ends when it is dropped.
    pub fn sever(&self) {
        if let Receiver::Tcp(r) = self {
            let stream: &TcpStream = r.get_ref().as_ref();
            if let Err(error) = socket2::SockRef::from(stream).shutdown(std::net::Shutdown::Both) {
                tracing::debug!(%error, "severing a connection: it was gone already");
            }
        }
    }

    /// Whether the next PDU has arrived whole, so that taking it in waits
    /// for nothing (over TCP: [`StreamReceiver::has_whole_pdu`]; over iSER
    /// never said, as nothing is held back there to wait for).
    pub fn has_whole_pdu(&self) -> bool {
        match self {
            Receiver::Tcp(r) => r.has_whole_pdu(),
            Receiver::Iser(_) => false,
        }
    }
}

impl PduReceiver for Receiver {
    async fn receive_header(&mut self) -> Result<Option<Header>, DatamoverError> {
        match self {
            Receiver::Tcp(r) => r.receive_header().await,
            Receiver::Iser(r) => r.receive_header().await,
        }
    }

    async fn receive_data_into(&mut self, destination: &mut [u8]) -> Result<(), DatamoverError> {
        match self {
            Receiver::Tcp(r) => r.receive_data_into(destination).await,
            Receiver::Iser(r) => r.receive_data_into(destination).await,
        }
    }

    async fn receive_data_into_slices(
        &mut self,
        destinations: &mut [&mut [u8]],
    ) -> Result<(), DatamoverError> {
        match self {
            Receiver::Tcp(r) => r.receive_data_into_slices(destinations).await,
            Receiver::Iser(r) => r.receive_data_into_slices(destinations).await,
        }
    }

    async fn receive_data_in_buffer(
        &mut self,
        buffer: &mut crate::write_buffer::WriteBuffer,
        range: std::ops::Range<usize>,
    ) -> Result<(), DatamoverError> {
        match self {
            Receiver::Tcp(r) => r.receive_data_in_buffer(buffer, range).await,
            Receiver::Iser(r) => r.receive_data_in_buffer(buffer, range).await,
        }
    }

    async fn discard_data(&mut self, scratch: &mut [u8]) -> Result<(), DatamoverError> {
        match self {
            Receiver::Tcp(r) => r.discard_data(scratch).await,
            Receiver::Iser(r) => r.discard_data(scratch).await,
        }
    }

    async fn receive_data_in_place(
        &mut self,
        buffer: &mut Vec<u8>,
        range: std::ops::Range<usize>,
    ) -> Result<(), DatamoverError> {
        match self {
            Receiver::Tcp(r) => r.receive_data_in_place(buffer, range).await,
            Receiver::Iser(r) => r.receive_data_in_place(buffer, range).await,
        }
    }

    async fn receive_data(&mut self) -> Result<Vec<u8>, DatamoverError> {
        match self {
            Receiver::Tcp(r) => r.receive_data().await,
            Receiver::Iser(r) => r.receive_data().await,
        }
    }
}

impl PduSender for Sender {
    async fn send_control(&mut self, header: &Header, data: &[u8]) -> Result<(), DatamoverError> {
        match self {
            Sender::Tcp(s) => s.send_control(header, data).await,
            Sender::Iser(s) => s.send_control(header, data).await,
        }
    }

    async fn put_data(&mut self, header: &Header, data: &[u8]) -> Result<(), DatamoverError> {
        match self {
            Sender::Tcp(s) => s.put_data(header, data).await,
            Sender::Iser(s) => s.put_data(header, data).await,
        }
    }

    async fn put_data_owned(
        &mut self,
        header: &Header,
        data: bytes::Bytes,
    ) -> Result<(), DatamoverError> {
        match self {
            Sender::Tcp(s) => s.put_data(header, &data).await,
            Sender::Iser(s) => s.put_data_owned(header, data).await,
        }
    }

    async fn put_data_gather(
        &mut self,
        header: &Header,
        data: crate::gather::Gather,
    ) -> Result<(), DatamoverError> {
        match self {
            Sender::Tcp(s) => s.put_data_gather(header, data).await,
            Sender::Iser(s) => s.put_data_gather(header, data).await,
        }
    }

    async fn terminate(&mut self) -> Result<(), DatamoverError> {
        match self {
            Sender::Tcp(s) => s.terminate().await,
            Sender::Iser(s) => s.terminate().await,
        }
    }
}

impl Sender {
    /// While `on`, short PDUs are held back to leave with the next write or
    /// at [`Sender::flush`] (over TCP: [`StreamSender::hold`]); over iSER
    /// every PDU is a message of its own, sent at once.
    pub fn hold(&mut self, on: bool) {
        match self {
            Sender::Tcp(s) => s.hold(on),
            Sender::Iser(_) => {}
        }
    }

    /// Writes every PDU held back.
    pub async fn flush(&mut self) -> Result<(), DatamoverError> {
        match self {
            Sender::Tcp(s) => s.flush().await,
            Sender::Iser(_) => Ok(()),
        }
    }

    /// Sends every PDU of `batch`, in order (over TCP in as few writes as
    /// the socket allows).
    pub async fn send_batch(&mut self, batch: &PduBatch) -> Result<(), DatamoverError> {
        match self {
            Sender::Tcp(s) => s.send_batch(batch).await,
            Sender::Iser(s) => s.send_batch(batch).await,
        }
    }

    /// `Send_Control` behind a batch (over TCP in one vectored write).
    pub async fn send_control_after(
        &mut self,
        batch: &PduBatch,
        header: &Header,
        data: &[u8],
    ) -> Result<(), DatamoverError> {
        match self {
            Sender::Tcp(s) => s.send_control_after(batch, header, data).await,
            Sender::Iser(s) => s.send_control_after(batch, header, data).await,
        }
    }

    /// The digests PDUs are sent with (for a [`PduBatch`]); always none
    /// over iSER.
    pub fn digests(&self) -> Digests {
        match self {
            Sender::Tcp(s) => s.digests(),
            Sender::Iser(_) => Digests::default(),
        }
    }

    /// The TCP stream under a TCP sender, for tests that write bytes which
    /// are not a well-formed PDU.
    pub fn tcp_mut(&mut self) -> Option<&mut OwnedWriteHalf> {
        match self {
            Sender::Tcp(s) => Some(s.get_mut()),
            Sender::Iser(_) => None,
        }
    }
}

/// One connection's datamover (RFC 5047 `Allocate_Connection_Resources`
/// when made).
#[derive(Debug)]
pub struct Datamover {
    /// The receive direction.
    pub receiver: Receiver,
    /// The send direction.
    pub sender: Sender,
    descriptors: DataDescriptors,
    local: SocketAddr,
    peer: SocketAddr,
}

impl Datamover {
    /// The TCP datamover over a connected socket.
    pub fn tcp(stream: TcpStream) -> std::io::Result<Self> {
        let tcp = TcpDatamover::new(stream)?;
        let (local, peer) = (tcp.local_addr(), tcp.peer_addr());
        let (receiver, sender) = tcp.split();
        Ok(Datamover {
            receiver: Receiver::Tcp(receiver),
            sender: Sender::Tcp(sender),
            descriptors: DataDescriptors::default(),
            local,
            peer,
        })
    }

    /// The iSER datamover over an established RDMA stream.
    pub fn iser(iser: IserDatamover) -> Self {
        let (local, peer) = (iser.local_addr(), iser.peer_addr());
        let descriptors = iser.descriptors();
        let (receiver, sender) = iser.split();
        Datamover {
            receiver: Receiver::Iser(receiver),
            sender: Sender::Iser(sender),
            descriptors,
            local,
            peer,
        }
    }

    /// Whether the connection is RDMA-capable (login then negotiates
    /// `RDMAExtensions=Yes`, digests None and the two RecvDataSegmentLength
    /// keys of RFC 7145 section 6).
    pub fn rdma_capable(&self) -> bool {
        matches!(self.receiver, Receiver::Iser(_))
    }

    /// RFC 5047 `Notice_Key_Values` + `Enable_Datamover`: the negotiated
    /// digests (TCP) and the data segment length this side declared apply
    /// from the next PDU on.
    pub fn enable(&mut self, digests: Digests, max_recv_data_segment_length: u32) {
        match (&mut self.receiver, &mut self.sender) {
            (Receiver::Tcp(r), Sender::Tcp(s)) => {
                r.enable(digests, max_recv_data_segment_length);
                s.enable(digests);
            }
            (Receiver::Iser(r), _) => r.enable(max_recv_data_segment_length),
            _ => {}
        }
    }

    /// Tells `tap` of every PDU sent and received from now on.
    pub fn set_tap(&mut self, tap: Option<Tap>) {
        match (&mut self.receiver, &mut self.sender) {
            (Receiver::Tcp(r), Sender::Tcp(s)) => {
                r.set_tap(tap.clone());
                s.set_tap(tap);
            }
            (_, Sender::Iser(s)) => s.set_tap(tap),
            _ => {}
        }
    }

    /// Asks for a socket send buffer of `bytes` (SO_SNDBUF, which Linux
    /// doubles for its bookkeeping and caps at `net.core.wmem_max`), fixed
    /// from now on instead of grown by the kernel's autotuning up to
    /// `net.ipv4.tcp_wmem`'s maximum. A sender whose buffer is full waits
    /// for the peer to drain it; a bigger buffer lets a reader of many 1 MiB
    /// Data-In sequences queue more of them per wake-up. Nothing over iSER,
    /// whose sends are RDMA messages. Returns the buffer the kernel set.
    pub fn set_send_buffer(&mut self, bytes: usize) -> std::io::Result<usize> {
        match &mut self.sender {
            Sender::Tcp(s) => {
                let writer = s.get_mut();
                let socket = socket2::SockRef::from(writer.as_ref());
                socket.set_send_buffer_size(bytes)?;
                socket.send_buffer_size()
            }
            Sender::Iser(_) => Ok(0),
        }
    }

    /// Turns Nagle's algorithm off (`true`) or on; RDMA streams always run
    /// with it off.
    pub fn set_nodelay(&mut self, nodelay: bool) -> std::io::Result<()> {
        match &mut self.sender {
            Sender::Tcp(s) => s.get_mut().as_ref().set_nodelay(nodelay),
            Sender::Iser(_) => Ok(()),
        }
    }

    /// The handle through which an initiator describes a write's data
    /// before its command (RFC 5047 DataDescriptorOut; a no-op over TCP).
    pub fn descriptors(&self) -> DataDescriptors {
        self.descriptors.clone()
    }

    /// This end's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The two directions, to drive from separate tasks.
    pub fn split(self) -> (Receiver, Sender) {
        (self.receiver, self.sender)
    }
}
