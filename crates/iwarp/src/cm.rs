//! The connection manager: the MPA start-up exchange (RFC 5044 §7.1) with
//! RFC 6581's IRD/ORD negotiation, on a connected TCP stream, then the
//! queue pair.
//!
//! Rules kept (and why): markers are refused both ways (Linux siw never
//! does them; a request with M set gets a reply with R set); CRC is used
//! when either side asks (RFC 5044 §7.1.2); revisions 1 and 2 are
//! accepted, revision 2 with the enhanced flag carries IRD/ORD words and
//! the reply never states an ORD above the initiator's IRD nor an IRD
//! below its ORD (siw Terminates "insufficient IRD" otherwise); we never
//! ask for peer-to-peer mode, and answer a peer that does in
//! client-server mode with the P bit clear (RFC 6581 §5 lets the responder
//! decline; the initiator then closes if it cannot live with that).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::{Error, llp_code};
use crate::fpdu::Encoder;
use crate::qp::{Agreed, PeerParams, QueuePair};
use crate::verbs::{QpCaps, RecvRequest};
use crate::wire::WireError;
use crate::wire::ddp::{Buffer, DdpRepr};
use crate::wire::mpa::{
    HEADER_LEN, IrdOrdRepr, MAX_IRD_ORD, MAX_PRIVATE_DATA, MAX_PRIVATE_DATA_RFC, StartFrameRepr,
    mulpdu_for_mss,
};
use crate::wire::rdmap::{CtrlRepr, Opcode, TerminateRepr};

/// Connection-manager parameters for our side of the MPA exchange.
#[derive(Clone, Debug)]
pub struct ConnectParams {
    /// The ULP's private data (after the RFC 6581 IRD/ORD words), <= 252 bytes.
    pub private_data: Vec<u8>,
    /// RDMA Read Requests we accept outstanding (inbound).
    pub ird: u16,
    /// RDMA Read Requests we issue outstanding (outbound).
    pub ord: u16,
    /// Ask for MPA CRC (default true); CRC is used if either side asks.
    pub crc: bool,
    /// Queue sizes.
    pub caps: QpCaps,
    /// MPA exchange time limit (default 10 s).
    pub timeout: Duration,
}

impl Default for ConnectParams {
    fn default() -> Self {
        ConnectParams {
            private_data: Vec::new(),
            ird: 16,
            ord: 16,
            crc: true,
            caps: QpCaps::default(),
            timeout: Duration::from_secs(10),
        }
    }
}

/// Active side: MPA Request on an already connected TCP stream, waits for the Reply.
pub async fn connect(
    mut stream: TcpStream,
    params: ConnectParams,
    initial_recvs: Vec<RecvRequest>,
) -> Result<QueuePair, Error> {
    check_params(&params)?;
    stream.set_nodelay(true)?;
    let ours = IrdOrdRepr {
        ird: params.ird,
        ord: params.ord,
        ..Default::default()
    };
    let frame = start_frame(
        false,
        params.crc,
        false,
        2,
        Some(ours),
        &params.private_data,
    );
    let exchange = async {
        stream.write_all(&frame).await?;
        read_frame(&mut stream).await
    };
    let (hdr, pd) = tokio::time::timeout(params.timeout, exchange)
        .await
        .map_err(|_| Error::Timeout)??;
    if !hdr.reply {
        return Err(Error::Mpa("the peer answered with an MPA Request".into()));
    }
    if hdr.reject {
        return Err(Error::Mpa(format!(
            "the peer rejected the connection (private data {pd:02x?})"
        )));
    }
    if hdr.markers {
        return Err(Error::Mpa(
            "the peer's Reply asks for markers, which we do not support".into(),
        ));
    }
    if !(1..=2).contains(&hdr.revision) {
        return Err(Error::Mpa(format!("MPA Reply revision {}", hdr.revision)));
    }
    let (theirs, ulp) = split_private_data(&hdr, &pd)?;
    let theirs = theirs.unwrap_or(IrdOrdRepr {
        ird: params.ord,
        ord: params.ird,
        ..Default::default()
    });
    if theirs.p2p {
        return Err(Error::Mpa(
            "the peer's Reply chose peer-to-peer mode, which we did not ask for".into(),
        ));
    }
    if theirs.ord > params.ird {
        // RFC 6581 §7: the responder may not plan more Reads than we accept;
        // say so the way siw does (LLP "insufficient IRD") and close.
        let mut t = Vec::new();
        let term = TerminateRepr {
            layer: 2,
            etype: 0,
            code: llp_code::INSUFFICIENT_IRD,
            m: false,
            d: false,
            r: false,
        };
        let mut extra = [0u8; TerminateRepr::LEN];
        term.emit(&mut extra);
        let ddp_hdr = DdpRepr {
            last: true,
            version: crate::wire::ddp::VERSION,
            ulp_ctrl: CtrlRepr::byte(Opcode::Terminate),
            buffer: Buffer::Untagged {
                ulp: 0,
                qn: 2,
                msn: 1,
                mo: 0,
            },
        };
        Encoder {
            crc: params.crc || hdr.crc,
        }
        .push(&mut t, &ddp_hdr, &extra, &[]);
        let _ = tokio::time::timeout(params.timeout, stream.write_all(&t)).await;
        let _ = stream.shutdown().await;
        return Err(Error::Mpa(format!(
            "the peer's ORD {} exceeds our IRD {} (sent Terminate: insufficient IRD)",
            theirs.ord, params.ird
        )));
    }
    let peer = PeerParams {
        private_data: ulp,
        ird: theirs.ird,
        ord: theirs.ord,
        crc: params.crc || hdr.crc,
        revision: hdr.revision,
    };
    let agreed = Agreed {
        mulpdu: mulpdu(&stream),
        peer,
        caps: params.caps,
        ird: params.ird,
        ord: params.ord.min(theirs.ird),
    };
    QueuePair::start(stream, agreed, initial_recvs)
}

/// Passive side: reads and checks the peer's MPA Request (bounded by
/// `timeout`). A request asking for markers is answered with a Reply with
/// R set and refused.
pub async fn accept_request(
    mut stream: TcpStream,
    timeout: Duration,
) -> Result<ConnectRequest, Error> {
    stream.set_nodelay(true)?;
    let (hdr, pd) = tokio::time::timeout(timeout, read_frame(&mut stream))
        .await
        .map_err(|_| Error::Timeout)??;
    if hdr.reply {
        return Err(Error::Mpa("an MPA Reply where a Request was due".into()));
    }
    let refuse = if hdr.reject {
        Some("an MPA Request with the Reject bit".to_string())
    } else if hdr.markers {
        Some("the peer asks for markers, which we do not support".to_string())
    } else if !(1..=2).contains(&hdr.revision) {
        Some(format!("MPA Request revision {}", hdr.revision))
    } else {
        None
    };
    let split = split_private_data(&hdr, &pd);
    let refuse = refuse.or_else(|| split.as_ref().err().map(|e| e.to_string()));
    if let Some(why) = refuse {
        let reply = start_frame(true, false, true, hdr.revision.clamp(1, 2), None, &[]);
        let _ = tokio::time::timeout(timeout, stream.write_all(&reply)).await;
        return Err(Error::Mpa(why));
    }
    let (theirs, ulp) = split?;
    let peer_addr = stream.peer_addr()?;
    Ok(ConnectRequest {
        stream,
        peer_addr,
        enhanced: theirs.is_some(),
        theirs,
        peer: PeerParams {
            private_data: ulp,
            ird: theirs.map_or(0, |t| t.ird),
            ord: theirs.map_or(0, |t| t.ord),
            crc: hdr.crc,
            revision: hdr.revision,
        },
        timeout,
    })
}

/// A checked MPA Request waiting for our answer.
pub struct ConnectRequest {
    stream: TcpStream,
    peer_addr: SocketAddr,
    enhanced: bool,
    theirs: Option<IrdOrdRepr>,
    peer: PeerParams,
    timeout: Duration,
}

impl ConnectRequest {
    /// The peer's private data, IRD/ORD (0 when it stated none) and CRC wish.
    pub fn peer(&self) -> &PeerParams {
        &self.peer
    }
    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer_addr
    }
    /// Whether the peer asked for peer-to-peer mode (we answer client-server).
    pub fn peer_to_peer(&self) -> bool {
        self.theirs.is_some_and(|t| t.p2p)
    }

    /// Sends the MPA Reply and starts the queue pair; `initial_recvs` are
    /// posted before anything the peer sends after our Reply is read.
    /// Bytes from the peer before our Reply (client-server mode forbids
    /// them) are an error.
    pub async fn accept(
        mut self,
        params: ConnectParams,
        initial_recvs: Vec<RecvRequest>,
    ) -> Result<QueuePair, Error> {
        check_params(&params)?;
        let mut early = [0u8; 1];
        match self.stream.try_read(&mut early) {
            Ok(0) => return Err(Error::Closed),
            Ok(_) => {
                return Err(Error::Mpa(
                    "the peer sent bytes before our MPA Reply".into(),
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
        // Never an ORD above the initiator's IRD, nor an IRD below its ORD.
        let (ird, ord) = match self.theirs {
            Some(t) => (
                params.ird.max(t.ord).min(MAX_IRD_ORD),
                params.ord.min(t.ird),
            ),
            None => (params.ird, params.ord),
        };
        let words = self.enhanced.then_some(IrdOrdRepr {
            ird,
            ord,
            ..Default::default()
        });
        let crc = params.crc || self.peer.crc;
        let revision = self.peer.revision;
        let reply = start_frame(true, crc, false, revision, words, &params.private_data);
        tokio::time::timeout(self.timeout, self.stream.write_all(&reply))
            .await
            .map_err(|_| Error::Timeout)??;
        let mut peer = self.peer;
        peer.crc = crc;
        if self.theirs.is_none() {
            peer.ird = ord;
            peer.ord = ird;
        }
        let agreed = Agreed {
            mulpdu: mulpdu(&self.stream),
            peer,
            caps: params.caps,
            ird,
            ord,
        };
        QueuePair::start(self.stream, agreed, initial_recvs)
    }

    /// Sends an MPA Reply with the Reject bit and closes.
    pub async fn reject(mut self, private_data: &[u8]) -> Result<(), Error> {
        if private_data.len() > MAX_PRIVATE_DATA {
            return Err(Error::Misuse(format!(
                "{} bytes of private data",
                private_data.len()
            )));
        }
        let words = self.enhanced.then_some(IrdOrdRepr::default());
        let reply = start_frame(true, false, true, self.peer.revision, words, private_data);
        tokio::time::timeout(self.timeout, self.stream.write_all(&reply))
            .await
            .map_err(|_| Error::Timeout)??;
        let _ = self.stream.shutdown().await;
        Ok(())
    }
}

fn check_params(p: &ConnectParams) -> Result<(), Error> {
    if p.private_data.len() + IrdOrdRepr::LEN > MAX_PRIVATE_DATA {
        return Err(Error::Misuse(format!(
            "{} bytes of private data (at most {})",
            p.private_data.len(),
            MAX_PRIVATE_DATA - IrdOrdRepr::LEN
        )));
    }
    if p.ird > MAX_IRD_ORD || p.ord > MAX_IRD_ORD {
        return Err(Error::Misuse(format!(
            "IRD {} / ORD {} above {MAX_IRD_ORD}",
            p.ird, p.ord
        )));
    }
    Ok(())
}

/// A whole start-up frame: header, IRD/ORD words when enhanced, private data.
pub(crate) fn start_frame(
    reply: bool,
    crc: bool,
    reject: bool,
    revision: u8,
    words: Option<IrdOrdRepr>,
    private_data: &[u8],
) -> Vec<u8> {
    let words = if revision >= 2 { words } else { None };
    let pd_len = private_data.len() + if words.is_some() { IrdOrdRepr::LEN } else { 0 };
    let hdr = StartFrameRepr {
        reply,
        markers: false,
        crc,
        reject,
        enhanced: words.is_some(),
        revision,
        pd_len: pd_len as u16,
    };
    let mut b = vec![0u8; HEADER_LEN + pd_len];
    hdr.emit(&mut b);
    let mut at = HEADER_LEN;
    if let Some(w) = words {
        w.emit(&mut b[at..]);
        at += IrdOrdRepr::LEN;
    }
    b[at..].copy_from_slice(private_data);
    b
}

/// Reads one start-up frame: the header, then exactly its private data.
async fn read_frame(stream: &mut TcpStream) -> Result<(StartFrameRepr, Vec<u8>), Error> {
    let mut h = [0u8; HEADER_LEN];
    stream.read_exact(&mut h).await?;
    let hdr = StartFrameRepr::parse(&h).map_err(|e| match e {
        WireError::BadKey => Error::Mpa(format!("not an MPA start-up frame: {:02x?}", &h[..16])),
        WireError::Truncated => Error::Mpa("truncated MPA start-up frame".into()),
    })?;
    if usize::from(hdr.pd_len) > MAX_PRIVATE_DATA_RFC {
        return Err(Error::Mpa(format!(
            "private data of {} bytes (at most 512)",
            hdr.pd_len
        )));
    }
    let mut pd = vec![0u8; usize::from(hdr.pd_len)];
    stream.read_exact(&mut pd).await?;
    Ok((hdr, pd))
}

/// Splits the IRD/ORD words (revision 2 with the enhanced flag) from the ULP's private data.
pub(crate) fn split_private_data(
    hdr: &StartFrameRepr,
    pd: &[u8],
) -> Result<(Option<IrdOrdRepr>, Vec<u8>), Error> {
    if hdr.revision >= 2 && hdr.enhanced {
        let words = IrdOrdRepr::parse(pd).map_err(|_| {
            Error::Mpa(format!(
                "enhanced MPA frame with {} bytes of private data (IRD/ORD need 4)",
                pd.len()
            ))
        })?;
        Ok((Some(words), pd[IrdOrdRepr::LEN..].to_vec()))
    } else {
        Ok((None, pd.to_vec()))
    }
}

/// MULPDU from the socket's MSS (TCP_MAXSEG), so an FPDU fits one segment.
fn mulpdu(stream: &TcpStream) -> usize {
    let mss = socket2::SockRef::from(stream).tcp_mss().unwrap_or(1448);
    mulpdu_for_mss(mss as usize)
}
