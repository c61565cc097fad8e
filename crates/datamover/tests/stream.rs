//! The stream datamover over an in-memory pipe: PDUs of every data size go
//! through the sender and come out of the receiver whole, with and without
//! digests, landed in caller buffers through both the buffered and the
//! direct-read paths; a corrupted data digest, a truncated stream and a
//! misused receive give errors, never a panic or a hang. A batch of PDUs
//! is the same bytes as the PDUs sent one by one; PDUs held back leave in
//! order with the next write, a flush or the end; the receiver says when
//! the next PDU is buffered whole.

use iscsi_datamover::tcp::{PduBatch, StreamReceiver, StreamSender};
use iscsi_datamover::{DatamoverError, PduReceiver, PduSender};
use iscsi_proto::error::DecodeError;
use iscsi_proto::pdu::{DataIn, Digests, Header, NopOut, Pdu};
use iscsi_proto::serial::DataSn;
use tokio::io::AsyncWriteExt;

fn data_in(offset: u32, len: usize) -> Header {
    Header::new(
        Pdu::DataIn(DataIn {
            final_flag: true,
            initiator_task_tag: 7,
            target_transfer_tag: 0xFFFF_FFFF,
            data_sn: DataSn::new(offset / 512),
            buffer_offset: offset,
            ..DataIn::default()
        }),
        len as u32,
    )
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A connection without digests and one with both.
const NO_AND_BOTH_DIGESTS: [Digests; 2] = [
    Digests {
        header: false,
        data: false,
    },
    Digests {
        header: true,
        data: true,
    },
];

const SIZES: [usize; 9] = [0, 1, 3, 4, 511, 4096, 16 * 1024 - 1, 64 * 1024 + 3, 1 << 20];

async fn round_trip(digests: Digests, into_place: bool) {
    let (client, server) = tokio::io::duplex(64 * 1024);
    let mut sender = StreamSender::new(client);
    let mut receiver = StreamReceiver::new(server);
    sender.enable(digests);
    receiver.enable(digests, 1 << 20);
    let writer = tokio::spawn(async move {
        for (i, &len) in SIZES.iter().enumerate() {
            let data = pattern(len, i as u8);
            sender
                .put_data(&data_in(i as u32, len), &data)
                .await
                .unwrap();
        }
        sender.terminate().await.unwrap();
    });
    for (i, &len) in SIZES.iter().enumerate() {
        let header = receiver.receive_header().await.unwrap().expect("a PDU");
        assert_eq!(header, data_in(i as u32, len));
        let data = if into_place {
            // A destination bigger than the segment, as a task's buffer is.
            let mut buffer = vec![0xEE; len + 100];
            receiver
                .receive_data_into(&mut buffer[50..50 + len])
                .await
                .unwrap();
            assert!(buffer[..50].iter().all(|&b| b == 0xEE));
            assert!(buffer[50 + len..].iter().all(|&b| b == 0xEE));
            buffer[50..50 + len].to_vec()
        } else {
            receiver.receive_data().await.unwrap()
        };
        assert_eq!(data, pattern(len, i as u8), "PDU {i}, {len} bytes");
    }
    assert!(receiver.receive().await.unwrap().is_none(), "clean end");
    writer.await.unwrap();
}

#[tokio::test]
async fn every_size_round_trips_without_digests() {
    round_trip(Digests::default(), false).await;
    round_trip(Digests::default(), true).await;
}

#[tokio::test]
async fn every_size_round_trips_with_both_digests() {
    let both = Digests {
        header: true,
        data: true,
    };
    round_trip(both, false).await;
    round_trip(both, true).await;
}

/// A Data-In PDU of each length, with its data.
fn data_ins(lengths: &[usize]) -> Vec<(Header, Vec<u8>)> {
    lengths
        .iter()
        .enumerate()
        .map(|(i, &len)| (data_in(i as u32, len), pattern(len, i as u8)))
        .collect()
}

/// The bytes of one PDU as the sender writes them.
async fn encoded(header: &Header, data: &[u8], digests: Digests) -> Vec<u8> {
    let (client, server) = tokio::io::duplex(4 << 20);
    let mut sender = StreamSender::new(client);
    sender.enable(digests);
    sender.send_control(header, data).await.unwrap();
    drop(sender);
    let mut bytes = Vec::new();
    let mut server = server;
    tokio::io::AsyncReadExt::read_to_end(&mut server, &mut bytes)
        .await
        .unwrap();
    bytes
}

#[tokio::test]
async fn a_corrupted_data_digest_is_reported_and_the_next_pdu_still_arrives() {
    let digests = Digests {
        header: true,
        data: true,
    };
    for len in [100usize, 200 * 1024] {
        let data = pattern(len, 1);
        let mut bad = encoded(&data_in(0, len), &data, digests).await;
        let flip = 48 + 4 + len / 2;
        bad[flip] ^= 0x10;
        let good = encoded(&data_in(1, 5), &pattern(5, 2), digests).await;
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let mut receiver = StreamReceiver::new(server);
        receiver.enable(digests, 1 << 20);
        let writer = tokio::spawn(async move {
            client.write_all(&bad).await.unwrap();
            client.write_all(&good).await.unwrap();
        });
        receiver.receive_header().await.unwrap().unwrap();
        let mut buffer = vec![0; len];
        match receiver.receive_data_into(&mut buffer).await {
            Err(DatamoverError::Decode(DecodeError::DataDigestMismatch { .. })) => {}
            other => panic!("expected a data digest error, got {other:?}"),
        }
        // A data digest error leaves the connection usable (RFC 7143 7.8).
        let next = receiver.receive().await.unwrap().unwrap();
        assert_eq!(next.header, data_in(1, 5));
        assert_eq!(next.data, pattern(5, 2));
        writer.await.unwrap();
    }
}

#[tokio::test]
async fn truncation_anywhere_is_an_error_and_a_boundary_is_a_clean_end() {
    let nop = Header::new(
        Pdu::NopOut(NopOut {
            initiator_task_tag: 1,
            target_transfer_tag: 0xFFFF_FFFF,
            ..NopOut::default()
        }),
        40_000,
    );
    let digests = Digests {
        header: true,
        data: true,
    };
    let bytes = encoded(&nop, &pattern(40_000, 3), digests).await;
    for cut in [1, 47, 48, 51, 52, 1000, 30_000, bytes.len() - 1] {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let mut receiver = StreamReceiver::new(server);
        receiver.enable(digests, 1 << 20);
        client.write_all(&bytes[..cut]).await.unwrap();
        drop(client);
        let result = match receiver.receive_header().await {
            Ok(Some(_)) => receiver.receive_data().await.map(|_| ()),
            Ok(None) => panic!("cut at {cut}: reported as a clean end"),
            Err(e) => Err(e),
        };
        assert!(
            matches!(result, Err(DatamoverError::Truncated)),
            "cut at {cut}: {result:?}"
        );
    }
}

#[tokio::test]
async fn misuse_is_an_error() {
    let digests = Digests::default();
    let bytes = encoded(&data_in(0, 10), &pattern(10, 0), digests).await;
    let (mut client, server) = tokio::io::duplex(1 << 16);
    client.write_all(&bytes).await.unwrap();
    client.write_all(&bytes).await.unwrap();
    let mut receiver = StreamReceiver::new(server);
    receiver.receive_header().await.unwrap().unwrap();
    let mut wrong = [0u8; 9];
    assert!(matches!(
        receiver.receive_data_into(&mut wrong).await,
        Err(DatamoverError::Misuse(_))
    ));
    assert!(matches!(
        receiver.receive_header().await,
        Err(DatamoverError::Misuse(_))
    ));
    let mut right = [0u8; 10];
    receiver.receive_data_into(&mut right).await.unwrap();
    assert_eq!(right.to_vec(), pattern(10, 0));
    assert!(receiver.receive().await.unwrap().is_some());
}

#[tokio::test]
async fn a_segment_longer_than_declared_is_refused_before_allocation() {
    let bytes = encoded(&data_in(0, 9000), &pattern(9000, 0), Digests::default()).await;
    let (mut client, server) = tokio::io::duplex(1 << 16);
    client.write_all(&bytes).await.unwrap();
    let mut receiver = StreamReceiver::new(server);
    // Login phase: 8192 bytes at most.
    match receiver.receive_header().await {
        Err(DatamoverError::Decode(DecodeError::DataSegmentTooLong { .. })) => {}
        other => panic!("expected DataSegmentTooLong, got {other:?}"),
    }
}

#[tokio::test]
async fn a_batch_is_the_same_bytes_as_its_pdus_sent_one_by_one_in_order() {
    for digests in NO_AND_BOTH_DIGESTS {
        let pdus = data_ins(&[0, 1, 5, 48, 4096, 16 * 1024 - 3]);
        let mut expected = Vec::new();
        for (header, data) in &pdus {
            expected.extend(encoded(header, data, digests).await);
        }
        let mut batch = PduBatch::new(digests);
        assert!(batch.is_empty());
        for (header, data) in &pdus[..pdus.len() - 1] {
            batch.push(header, data).unwrap();
        }
        assert_eq!(batch.len(), pdus.len() - 1);
        // Appending moves PDUs in order, into an empty batch or behind
        // others.
        let mut front = PduBatch::new(digests);
        let mut back = PduBatch::new(digests);
        front.push(&pdus[0].0, &pdus[0].1).unwrap();
        for (header, data) in &pdus[1..pdus.len() - 1] {
            back.push(header, data).unwrap();
        }
        let mut empty = PduBatch::new(digests);
        empty.append(&mut front);
        assert!(front.is_empty() && front.bytes().is_empty());
        empty.append(&mut back);
        assert!(back.is_empty() && back.bytes().is_empty());
        assert_eq!((empty.len(), empty.bytes()), (batch.len(), batch.bytes()));
        let (last_header, last_data) = &pdus[pdus.len() - 1];
        let last = encoded(last_header, last_data, digests).await;
        assert_eq!(batch.bytes(), &expected[..expected.len() - last.len()]);

        // Written alone, then behind a batch with a directly sent PDU: the
        // wire carries every PDU once, in order, and the receiver takes
        // them apart again.
        let (client, server) = tokio::io::duplex(1 << 20);
        let mut sender = StreamSender::new(client);
        sender.enable(digests);
        assert_eq!(sender.digests(), digests);
        sender.send_batch(&batch).await.unwrap();
        sender
            .send_control_after(&batch, last_header, last_data)
            .await
            .unwrap();
        batch.clear(0);
        assert!(batch.is_empty() && batch.bytes().is_empty());
        sender.send_batch(&batch).await.unwrap();
        sender.terminate().await.unwrap();
        let mut wire = Vec::new();
        let mut server = server;
        tokio::io::AsyncReadExt::read_to_end(&mut server, &mut wire)
            .await
            .unwrap();
        let body = &expected[..expected.len() - last.len()];
        assert_eq!(wire, [body, body, &last].concat());

        let mut receiver = StreamReceiver::new(&wire[..]);
        receiver.enable(digests, 1 << 20);
        for (header, data) in pdus[..pdus.len() - 1].iter().chain(&pdus) {
            let received = receiver.receive().await.unwrap().expect("a PDU");
            assert_eq!(&received.header, header);
            assert_eq!(&received.data, data);
        }
        assert!(receiver.receive().await.unwrap().is_none());
    }
}

#[test]
fn a_batch_refuses_a_pdu_whose_length_does_not_match_its_data() {
    let mut batch = PduBatch::new(Digests::default());
    assert!(matches!(
        batch.push(&data_in(0, 10), &[0; 9]),
        Err(DatamoverError::Encode(_))
    ));
    assert!(batch.is_empty() && batch.bytes().is_empty());
}

/// A writer that notes, at each write, how many PDUs the counter has seen:
/// the first bytes of a PDU must not reach the wire before it is counted,
/// or a caller reading the counts after the peer's answer could miss it.
struct CountingAtWrite {
    counter: std::sync::Arc<iscsi_datamover::tap::WireCounter>,
    seen: Vec<u64>,
}

impl tokio::io::AsyncWrite for CountingAtWrite {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let pdus = self.counter.counts().pdus;
        self.seen.push(pdus);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn every_send_path_counts_its_pdus_before_writing_them() {
    use iscsi_datamover::tap::{Tap, WireCounter};
    let counter = std::sync::Arc::new(WireCounter::default());
    let mut sender = StreamSender::new(CountingAtWrite {
        counter: counter.clone(),
        seen: Vec::new(),
    });
    sender.set_tap(Some(Tap::new(counter.clone(), 1)));
    let mut batch = PduBatch::new(Digests::default());
    batch.push(&data_in(0, 512), &[1; 512]).unwrap();
    batch.push(&data_in(1, 512), &[2; 512]).unwrap();

    let mut expected = 0;
    let mut check = |sender: &mut StreamSender<CountingAtWrite>, pdus: u64, path: &str| {
        expected += pdus;
        let seen = std::mem::take(&mut sender.get_mut().seen);
        assert!(!seen.is_empty(), "{path} wrote nothing");
        assert!(
            seen.iter().all(|&counted| counted == expected),
            "{path}: counts at each write {seen:?}, expected {expected}"
        );
    };
    sender.send_batch(&batch).await.unwrap();
    check(&mut sender, 2, "send_batch");
    sender
        .send_control_after(&batch, &data_in(2, 4), &[3; 4])
        .await
        .unwrap();
    check(&mut sender, 3, "send_control_after");
    sender.send_control(&data_in(3, 4), &[4; 4]).await.unwrap();
    check(&mut sender, 1, "send_control");
    let gather = iscsi_datamover::Gather::from_pieces(vec![
        bytes::Bytes::from_static(&[5; 100]),
        bytes::Bytes::from_static(&[6; 28]),
    ]);
    sender
        .put_data_gather(&data_in(4, 128), gather)
        .await
        .unwrap();
    check(&mut sender, 1, "put_data_gather");
    assert_eq!(counter.counts().data_in, 7);
}

/// Whatever of `server` arrives within a short wait (nothing, when the
/// sender holds everything back).
async fn arrived(server: &mut tokio::io::DuplexStream, len: usize) -> Vec<u8> {
    let mut bytes = vec![0; len];
    let mut got = 0;
    while got < len {
        let read = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            tokio::io::AsyncReadExt::read(server, &mut bytes[got..]),
        )
        .await;
        match read {
            Ok(Ok(n)) if n > 0 => got += n,
            _ => break,
        }
    }
    bytes.truncate(got);
    bytes
}

#[tokio::test]
async fn held_pdus_leave_in_order_with_the_next_write_a_flush_or_the_end() {
    for digests in NO_AND_BOTH_DIGESTS {
        // Sizes up to the most a held PDU may carry (64 KiB), one past it.
        let pdus = data_ins(&[0, 5, 4096, 64 * 1024 + 1, 100, 64 * 1024, 7]);
        let mut wire = Vec::new();
        for (header, data) in &pdus {
            wire.push(encoded(header, data, digests).await);
        }
        let (client, mut server) = tokio::io::duplex(4 << 20);
        let mut sender = StreamSender::new(client);
        sender.enable(digests);
        sender.hold(true);
        sender.send_control(&pdus[0].0, &pdus[0].1).await.unwrap();
        sender.put_data(&pdus[1].0, &pdus[1].1).await.unwrap();
        let gather = iscsi_datamover::Gather::from(bytes::Bytes::from(pdus[2].1.clone()));
        sender.put_data_gather(&pdus[2].0, gather).await.unwrap();
        assert!(
            arrived(&mut server, 1).await.is_empty(),
            "short PDUs are held"
        );
        // Too long to hold: written at once, behind the three held.
        sender.send_control(&pdus[3].0, &pdus[3].1).await.unwrap();
        assert_eq!(
            arrived(&mut server, wire[..4].concat().len()).await,
            wire[..4].concat()
        );
        sender.send_control(&pdus[4].0, &pdus[4].1).await.unwrap();
        sender.send_control(&pdus[5].0, &pdus[5].1).await.unwrap();
        assert!(arrived(&mut server, 1).await.is_empty());
        sender.flush().await.unwrap();
        assert_eq!(
            arrived(&mut server, wire[4..6].concat().len()).await,
            wire[4..6].concat()
        );
        // Not holding: written at once.
        sender.hold(false);
        sender.send_control(&pdus[6].0, &pdus[6].1).await.unwrap();
        assert_eq!(arrived(&mut server, wire[6].len()).await, wire[6]);
        // At most 256 KiB is held: the PDU that would pass it goes out
        // with the ones before it; the end of the stream flushes the rest.
        sender.hold(true);
        let big = &pdus[5];
        for _ in 0..4 {
            sender.send_control(&big.0, &big.1).await.unwrap();
        }
        assert_eq!(
            arrived(&mut server, 4 * wire[5].len()).await,
            wire[5].repeat(4)
        );
        sender.send_control(&pdus[0].0, &pdus[0].1).await.unwrap();
        sender.terminate().await.unwrap();
        let mut rest = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut server, &mut rest)
            .await
            .unwrap();
        assert_eq!(rest, wire[0]);
    }
}

#[tokio::test]
async fn the_receiver_tells_when_the_next_pdu_is_buffered_whole() {
    for digests in NO_AND_BOTH_DIGESTS {
        // Two short PDUs, one longer than a read from the stream takes (16
        // KiB: its data is read straight into place, then its padding with
        // what follows), and a last one.
        let pdus = data_ins(&[0, 6, 40 * 1024 + 1, 5]);
        let mut wire = Vec::new();
        for (header, data) in &pdus {
            wire.extend(encoded(header, data, digests).await);
        }
        let mut receiver = StreamReceiver::new(&wire[..]);
        receiver.enable(digests, 1 << 20);
        assert!(!receiver.has_whole_pdu(), "nothing read yet");
        let header = receiver.receive_header().await.unwrap().unwrap();
        assert_eq!(header, pdus[0].0);
        assert!(
            receiver.has_whole_pdu(),
            "the 6-byte PDU came with the first"
        );
        assert!(receiver.receive_header().await.unwrap().is_some());
        assert!(!receiver.has_whole_pdu(), "its data is not taken yet");
        assert_eq!(receiver.receive_data().await.unwrap(), pdus[1].1);
        assert!(!receiver.has_whole_pdu(), "40 KiB is not in one read");
        assert!(receiver.receive_header().await.unwrap().is_some());
        assert_eq!(receiver.receive_data().await.unwrap(), pdus[2].1);
        assert!(
            receiver.has_whole_pdu(),
            "the last PDU came with the third's padding"
        );
        assert!(receiver.receive().await.unwrap().is_some());
        assert!(!receiver.has_whole_pdu());
        assert!(receiver.receive().await.unwrap().is_none());
    }
}
