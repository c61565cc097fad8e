//! The reading task: reads the stream [`RX_BUF`] bytes at a time and hands
//! every whole FPDU in the buffer to [`Shared::handle`], in stream order;
//! a large RDMA Write or Read Response segment not yet all received is
//! placed straight from the socket into its region instead
//! ([`Shared::place_direct`]), so that its payload is copied once, by the
//! kernel.

use std::sync::Arc;

use iscsi_crc32c::Crc32c;
use tokio::io::AsyncReadExt;
use tokio::net::tcp::OwnedReadHalf;

use super::shared::{MAX_FPDU, RX_BUF, Shared, tagged_refusal};
use crate::error::{Error, TerminateReason};
use crate::fpdu;
use crate::mr::Access;
use crate::wire::ddp::{self, Buffer};
use crate::wire::rdmap::Opcode;

/// Tagged payloads at least this long, not yet all received, are read
/// from the socket straight into their region (one copy, the kernel's,
/// instead of a second one out of the receive buffer).
const DIRECT_MIN: usize = 16 * 1024;

/// A tagged segment at the front of the receive buffer whose payload will
/// be placed straight from the socket.
struct Direct {
    opcode: Opcode,
    last: bool,
    stag: u32,
    to: u64,
    /// MPA length field and DDP tagged header, as received (for the CRC).
    header: [u8; 2 + ddp::TAGGED_LEN],
    payload: usize,
    pad: usize,
}

/// Whether `bytes` (from the start of an FPDU) begin a large RDMA Write or
/// Read Response segment that is not all there yet. Anything else, and any
/// header that does not parse, takes the ordinary path (which reports the
/// error once the FPDU is whole).
fn direct_candidate(bytes: &[u8]) -> Option<Direct> {
    let header: [u8; 2 + ddp::TAGGED_LEN] = bytes.get(..2 + ddp::TAGGED_LEN)?.try_into().ok()?;
    let ulpdu_len = usize::from(u16::from_be_bytes([header[0], header[1]]));
    if bytes.len() >= crate::wire::mpa::fpdu_len(ulpdu_len) {
        return None;
    }
    let payload = ulpdu_len.checked_sub(ddp::TAGGED_LEN)?;
    if payload < DIRECT_MIN {
        return None;
    }
    let seg = fpdu::parse_ulpdu(&header[2..]).ok()?;
    let Buffer::Tagged { stag, to } = seg.buffer else {
        return None;
    };
    if !matches!(seg.opcode, Opcode::Write | Opcode::ReadResponse) {
        return None;
    }
    Some(Direct {
        opcode: seg.opcode,
        last: seg.last,
        stag,
        to,
        header,
        payload,
        pad: crate::wire::mpa::pad_len(ulpdu_len),
    })
}

/// The FPDU length of a tagged RDMA Write or Read Response segment whose
/// header `bytes` begin with (`None` for anything else or a header that
/// does not parse).
fn tagged_fpdu_len(bytes: &[u8]) -> Option<usize> {
    let header = bytes.get(..2 + ddp::TAGGED_LEN)?;
    let ulpdu_len = usize::from(u16::from_be_bytes([header[0], header[1]]));
    let seg = fpdu::parse_ulpdu(&header[2..]).ok()?;
    (matches!(seg.buffer, Buffer::Tagged { .. })
        && matches!(seg.opcode, Opcode::Write | Opcode::ReadResponse))
    .then(|| crate::wire::mpa::fpdu_len(ulpdu_len))
}

impl Shared {
    /// Places a large tagged segment straight from the socket: the same
    /// checks as [`Shared::handle`] first, then the payload read into the
    /// region, then the CRC over header, payload and pad (the stream is
    /// terminated on a bad one, as for any FPDU; bytes placed by then are
    /// the peer's to answer for). `buf[buffered]` holds the segment's start
    /// (its header and perhaps some payload). The payload and the trailer
    /// are read with vectored reads whose second part is `buf`: the pad and
    /// CRC, then up to a tagged header's worth of the next FPDU, so that a
    /// run of large segments costs about one system call each and none of
    /// their payload is copied out of `buf`. Returns how many bytes `buf`
    /// then holds, of which the first `pad + 4` were the trailer.
    async fn place_direct(
        &self,
        rd: &mut OwnedReadHalf,
        buf: &mut [u8],
        buffered: std::ops::Range<usize>,
        d: Direct,
    ) -> Result<(usize, usize), Error> {
        let local = |r: TerminateReason| Error::LocalTerminate(r);
        let (need, what) = match d.opcode {
            Opcode::Write => (Access::REMOTE_WRITE, "RDMA Write"),
            _ => {
                self.check_read_response(d.stag, d.to, d.payload)?;
                (Access::LOCAL_WRITE, "RDMA Read Response")
            }
        };
        let mut placement = self
            .pd
            .checkout(d.stag, d.to, d.payload, need)
            .map_err(|r| local(tagged_refusal(r, what, d.stag, d.to, d.payload)))?;
        // What came with the header: some of the payload, or all of it
        // and the start of the trailer (never all of the trailer: then the
        // FPDU would be whole and not placed here).
        let after_header = buffered.start + d.header.len()..buffered.end;
        let have = after_header.len().min(d.payload);
        let early_tail = after_header.len() - have;
        // The payload's place: one slice, or the pages of a page-list
        // region it spans.
        let mut dst = placement.destination(d.payload);
        copy_into(&mut dst, 0, &buf[after_header.start..][..have]);
        // The trailer bytes already here go where the reads below put the rest.
        buf.copy_within(after_header.end - early_tail..after_header.end, 0);
        let trailer_len = d.pad + 4;
        let room = trailer_len + DIRECT_HEADER;
        let received = async {
            let (mut filled, mut tail) = (have, early_tail);
            while tail < trailer_len {
                let n = if filled < d.payload {
                    read_into(rd, &mut dst, filled, &mut buf[..room]).await?
                } else {
                    read_into(rd, &mut [], 0, &mut buf[tail..room]).await?
                };
                if n == 0 {
                    return Err(Error::Closed);
                }
                let into_payload = n.min(d.payload - filled);
                filled += into_payload;
                tail += n - into_payload;
            }
            Ok(tail)
        }
        .await;
        let good = received.is_ok() && {
            let sent =
                u32::from_le_bytes([buf[d.pad], buf[d.pad + 1], buf[d.pad + 2], buf[d.pad + 3]]);
            if self.crc {
                let mut crc = Crc32c::new();
                crc.update(&d.header);
                for slice in &dst {
                    crc.update(slice);
                }
                crc.update(&buf[..d.pad]);
                crc.value() == sent
            } else {
                true
            }
        };
        drop(dst);
        self.pd.checkin(placement);
        let tail = received?;
        if !good {
            return Err(local(TerminateReason::llp(
                crate::error::llp_code::CRC,
                format!(
                    "FPDU CRC mismatch on a {}-byte {:?} payload placed directly at STag {:#x}, TO {:#x}",
                    d.payload, d.opcode, d.stag, d.to
                ),
            )));
        }
        if d.opcode == Opcode::ReadResponse {
            self.read_response_placed(d.payload, d.last)?;
        }
        Ok((trailer_len, tail))
    }
}

/// A tagged FPDU's MPA length and DDP header: what the reader must see to
/// decide on direct placement.
const DIRECT_HEADER: usize = 2 + ddp::TAGGED_LEN;

/// Copies `src` into the concatenation of `dst` from byte `at` of it.
fn copy_into(dst: &mut [&mut [u8]], at: usize, src: &[u8]) {
    let (mut skip, mut done) = (at, 0);
    for slice in dst.iter_mut() {
        if done == src.len() {
            break;
        }
        if skip >= slice.len() {
            skip -= slice.len();
            continue;
        }
        let n = (slice.len() - skip).min(src.len() - done);
        slice[skip..skip + n].copy_from_slice(&src[done..done + n]);
        done += n;
        skip = 0;
    }
}

/// One read into the concatenation of `first` from byte `from` of it, then
/// into `second`, with a single system call where the bytes are there
/// (tokio's read halves have no async vectored read).
async fn read_into(
    rd: &OwnedReadHalf,
    first: &mut [&mut [u8]],
    from: usize,
    second: &mut [u8],
) -> std::io::Result<usize> {
    loop {
        rd.readable().await?;
        let mut slices = Vec::with_capacity(first.len() + 1);
        let mut skip = from;
        for slice in first.iter_mut() {
            if skip >= slice.len() {
                skip -= slice.len();
                continue;
            }
            slices.push(std::io::IoSliceMut::new(&mut slice[skip..]));
            skip = 0;
        }
        slices.push(std::io::IoSliceMut::new(second));
        match rd.try_read_vectored(&mut slices) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            result => return result,
        }
    }
}

/// Reads the stream until it ends, placing and handling what arrives;
/// any error ends the stream (with a Terminate when it is ours to send).
pub(super) async fn rx_task(shared: Arc<Shared>, mut rd: OwnedReadHalf) {
    let mut ended = shared.ended.subscribe();
    let mut buf = vec![0u8; RX_BUF];
    let (mut start, mut end) = (0usize, 0usize);
    // In a run of large tagged segments: read no further than the next
    // FPDU's header, so that its payload can go straight into its region.
    let mut bulk = false;
    loop {
        loop {
            match fpdu::decode(&buf[start..end], shared.crc) {
                Ok(Some((seg, n))) => {
                    if matches!(seg.buffer, Buffer::Tagged { .. })
                        && seg.payload.len() >= DIRECT_MIN
                    {
                        bulk = true;
                    }
                    if let Err(e) = shared.handle(seg) {
                        shared.fail_terminating(e);
                        return;
                    }
                    start += n;
                }
                Ok(None) => break,
                Err(r) => {
                    shared.fail(Error::LocalTerminate(r.clone()), Some(r));
                    return;
                }
            }
        }
        if let Some(direct) = direct_candidate(&buf[start..end]) {
            // A large tagged payload that is not all here yet: the rest
            // goes from the socket straight into its region.
            match shared
                .place_direct(&mut rd, &mut buf, start..end, direct)
                .await
            {
                Ok((trailer, filled)) => {
                    start = trailer;
                    end = filled;
                    bulk = true;
                    continue;
                }
                Err(e) => {
                    shared.fail_terminating(e);
                    return;
                }
            }
        }
        // In a run, a short tagged segment (the rest of a message cut at
        // the MSS) is read whole with the next header, so that the run
        // goes on; whatever else comes next is not placed directly.
        let mut run_through = None;
        if end - start >= DIRECT_HEADER {
            match tagged_fpdu_len(&buf[start..end]) {
                Some(len) if bulk => run_through = Some(len + DIRECT_HEADER),
                _ => bulk = false,
            }
        }
        if start == end {
            start = 0;
            end = 0;
        } else if RX_BUF - end < MAX_FPDU {
            buf.copy_within(start..end, 0);
            end -= start;
            start = 0;
        }
        let limit = match (bulk, run_through) {
            (true, Some(len)) => (start + len).clamp(end + 1, RX_BUF),
            (true, None) => start + DIRECT_HEADER,
            (false, _) => RX_BUF,
        };
        tokio::select! {
            r = rd.read(&mut buf[end..limit]) => match r {
                Ok(0) => {
                    shared.fail(Error::Closed, None);
                    return;
                }
                Ok(n) => end += n,
                Err(e) => {
                    shared.fail(e.into(), None);
                    return;
                }
            },
            _ = ended.wait_for(|e| *e) => return,
        }
    }
}
