//! Two queue pairs over real loopback TCP: Sends, Writes, Reads, CRC
//! choices, ordering, queue limits and closing.

mod common;

use common::*;
use iscsi_iwarp::*;

#[tokio::test]
async fn send_recv_small() {
    let (c, s) = pair(0, 2).await;
    assert!(c.peer().crc && s.peer().crc);
    assert_eq!(s.peer().revision, 2);
    c.post_send(send(1, vec![bytes(b"hello")])).unwrap();
    let done = next(c.send_cq()).await;
    assert_eq!(
        (done.wr_id, done.opcode, done.status.clone(), done.byte_len),
        (1, WcOpcode::Send, WcStatus::Success, 5)
    );
    let r = next(s.recv_cq()).await;
    assert_eq!(
        (r.wr_id, r.opcode, r.byte_len, r.solicited, r.invalidated),
        (1000, WcOpcode::Recv, 5, false, None)
    );
    assert_eq!(r.buffer.unwrap(), b"hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_segment_send_is_reassembled() {
    let (c, s) = pair(0, 2).await;
    c.set_max_ulpdu(64);
    let region: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
    let mr = c.pd().register(region.clone(), Access::LOCAL_WRITE);
    let data = vec![
        bytes(b"head:"),
        Sge::Region(LocalBuffer {
            stag: mr.stag(),
            offset: 3,
            len: 9000,
        }),
    ];
    c.post_send(send(7, data)).unwrap();
    let r = next(s.recv_cq()).await;
    assert_eq!(r.status, WcStatus::Success);
    let mut want = b"head:".to_vec();
    want.extend_from_slice(&region[3..9003]);
    assert_eq!(r.buffer.unwrap(), want);
    // A second message after the multi-segment one keeps MSNs in step.
    c.post_send(send(8, vec![bytes(b"again")])).unwrap();
    assert_eq!(next(s.recv_cq()).await.buffer.unwrap(), b"again");
}

#[tokio::test]
async fn send_with_se_and_invalidate() {
    let (c, s) = pair(0, 2).await;
    let mr = s
        .pd()
        .register(vec![0; 4096], Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    c.post_send(SendRequest {
        wr_id: 3,
        signaled: true,
        op: SendOp::Send {
            data: vec![bytes(b"resp")],
            solicited: true,
            invalidate: Some(mr.stag()),
        },
    })
    .unwrap();
    let r = next(s.recv_cq()).await;
    assert!(r.solicited);
    assert_eq!(r.invalidated, Some(mr.stag()));
    assert!(!s.pd().is_valid(mr.stag()));
    // The invalidated STag is then refused for a Write: DDP tagged, invalid STag.
    c.post_send(SendRequest {
        wr_id: 4,
        signaled: true,
        op: SendOp::RdmaWrite {
            data: vec![bytes(&[1; 100])],
            remote: RemoteBuffer {
                stag: mr.stag(),
                to: mr.addr(),
            },
        },
    })
    .unwrap();
    tokio::time::timeout(T, c.closed()).await.unwrap();
    let Some(Error::RemoteTerminate(t)) = c.error() else {
        panic!("{:?}", c.error())
    };
    assert_eq!(
        (t.layer, t.etype, t.code),
        (iscsi_iwarp::error::Layer::Ddp, 1, 0)
    );
    assert!(matches!(s.error(), Some(Error::LocalTerminate(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_then_send_arrives_after_placement() {
    let (c, s) = pair(0, 4).await;
    let sink = s
        .pd()
        .register(vec![0; 1 << 20], Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let src: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let mr = c.pd().register(src.clone(), Access::LOCAL_WRITE);
    let remote = RemoteBuffer {
        stag: sink.stag(),
        to: sink.addr(),
    };
    c.post_send(SendRequest {
        wr_id: 1,
        signaled: false,
        op: SendOp::RdmaWrite {
            data: vec![Sge::Region(LocalBuffer {
                stag: mr.stag(),
                offset: 0,
                len: 1 << 20,
            })],
            remote,
        },
    })
    .unwrap();
    c.post_send(send(2, vec![bytes(b"done")])).unwrap();
    let r = next(s.recv_cq()).await;
    assert_eq!(r.buffer.unwrap(), b"done");
    assert!(s.pd().with_region(&sink, |b| b == &src[..]));
    // Unsignaled Write: the first send completion is the Send's.
    assert_eq!(next(c.send_cq()).await.wr_id, 2);
}

/// One RDMA Write from a gather list (shared bytes, a region, odd-sized
/// bytes): its FPDUs are cut across the pieces and the sink holds their
/// concatenation at the advertised offset, nothing around it touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_from_a_gather_list_is_placed_whole() {
    let (c, s) = pair(0, 4).await;
    let sink = s.pd().register(
        vec![0xEE; 300_000],
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    );
    let a: Vec<u8> = (0..65_536u32).map(|i| (i % 253) as u8).collect();
    let b: Vec<u8> = (0..100_000u32).map(|i| (i % 241) as u8).collect();
    let tail = b"a sliver".to_vec();
    let mr = c.pd().register(b.clone(), Access::LOCAL_WRITE);
    c.post_send(SendRequest {
        wr_id: 1,
        signaled: true,
        op: SendOp::RdmaWrite {
            data: vec![
                Sge::Bytes(bytes::Bytes::from(a.clone())),
                Sge::Region(LocalBuffer {
                    stag: mr.stag(),
                    offset: 0,
                    len: b.len(),
                }),
                Sge::Bytes(bytes::Bytes::from(tail.clone())),
            ],
            remote: RemoteBuffer {
                stag: sink.stag(),
                to: sink.addr() + 1000,
            },
        },
    })
    .unwrap();
    c.post_send(send(2, vec![bytes(b"done")])).unwrap();
    let done = next(c.send_cq()).await;
    assert_eq!(
        (done.wr_id, done.byte_len),
        (1, a.len() + b.len() + tail.len())
    );
    assert_eq!(next(s.recv_cq()).await.buffer.unwrap(), b"done");
    let expected: Vec<u8> = [&a[..], &b[..], &tail[..]].concat();
    assert!(s.pd().with_region(&sink, |sunk| {
        sunk[..1000].iter().all(|&x| x == 0xEE)
            && sunk[1000..1000 + expected.len()] == expected[..]
            && sunk[1000 + expected.len()..].iter().all(|&x| x == 0xEE)
    }));
}

/// Posts a signaled RDMA Read (`wr_id` 9) of all of `sink` from the start
/// of `source`, and returns its completion.
async fn read_whole(c: &QueuePair, sink: &MemoryRegion, source: &MemoryRegion) -> Completion {
    c.post_send(SendRequest {
        wr_id: 9,
        signaled: true,
        op: SendOp::RdmaRead {
            local: LocalBuffer {
                stag: sink.stag(),
                offset: 0,
                len: sink.len(),
            },
            remote: RemoteBuffer {
                stag: source.stag(),
                to: source.addr(),
            },
        },
    })
    .unwrap();
    next(c.send_cq()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_read_one_mib() {
    let (c, s) = pair(0, 0).await;
    let src: Vec<u8> = (0..1u32 << 20).map(|i| (i % 253) as u8).collect();
    let source = s.pd().register(src.clone(), Access::REMOTE_READ);
    let sink = c.pd().register(vec![0; 1 << 20], Access::LOCAL_WRITE);
    let done = read_whole(&c, &sink, &source).await;
    assert_eq!(
        (done.wr_id, done.opcode, done.status, done.byte_len),
        (9, WcOpcode::RdmaRead, WcStatus::Success, 1 << 20)
    );
    assert_eq!(c.pd().deregister(sink), src);
}

/// An RDMA Read into a page-list region (pages of a store's chunk size and
/// odd ones, with and without CRC: payloads cut by page boundaries, read
/// straight from the socket or out of the receive buffer): every byte lands
/// in its page, and the pages come back as registered. The peer can never
/// read such a region.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_read_into_pages() {
    for crc in [false, true] {
        let params = ConnectParams {
            crc,
            ..Default::default()
        };
        let (c, s) = pair_with(params.clone(), params, vec![], vec![]).await;
        let lens = [1000usize, 65536, 65536, 3, 200_000, 65536 * 4 + 17];
        let total: usize = lens.iter().sum();
        let src: Vec<u8> = (0..total as u32).map(|i| (i % 241) as u8).collect();
        let source = s.pd().register(src.clone(), Access::REMOTE_READ);
        let pages: Vec<Vec<u8>> = lens.iter().map(|&n| vec![0xEE; n]).collect();
        let sink = c
            .pd()
            .register_pages(pages, Access::LOCAL_WRITE | Access::REMOTE_READ);
        assert_eq!(sink.len(), total);
        let done = read_whole(&c, &sink, &source).await;
        assert_eq!(
            (done.status, done.byte_len),
            (WcStatus::Success, total),
            "crc {crc}"
        );
        let back = c.pd().deregister_pages(sink);
        let back_lens: Vec<usize> = back.iter().map(Vec::len).collect();
        assert_eq!(back_lens, lens, "the pages as registered");
        assert!(back.concat() == src, "crc {crc}: the bytes in order");
        // Never a Read source, whatever was asked at registration.
        let pages = c
            .pd()
            .register_pages(vec![vec![1; 64]], Access::REMOTE_READ);
        let sink = s.pd().register(vec![0; 64], Access::LOCAL_WRITE);
        let done = read_whole(&s, &sink, &pages).await;
        assert_ne!(
            done.status,
            WcStatus::Success,
            "a page-list region was read"
        );
    }
}

/// The source of a Read registered frozen (shared `Bytes`, answered
/// without a copy): the same bytes arrive, the peer cannot write it, and
/// the buffer comes back on deregistration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_read_from_frozen_bytes() {
    let (c, s) = pair(0, 0).await;
    let src: Vec<u8> = (0..(1u32 << 20) + 3).map(|i| (i % 251) as u8).collect();
    let source = s.pd().register_frozen(
        bytes::Bytes::from(src.clone()),
        Access::REMOTE_READ | Access::REMOTE_WRITE,
    );
    let sink = c.pd().register(vec![0; src.len()], Access::LOCAL_WRITE);
    let done = read_whole(&c, &sink, &source).await;
    assert_eq!((done.status, done.byte_len), (WcStatus::Success, src.len()));
    assert_eq!(c.pd().deregister(sink), src);
    // Write rights are not granted to frozen bytes, whatever was asked.
    c.post_send(SendRequest {
        wr_id: 10,
        signaled: true,
        op: SendOp::RdmaWrite {
            data: vec![Sge::Bytes(bytes::Bytes::from_static(b"overwrite"))],
            remote: RemoteBuffer {
                stag: source.stag(),
                to: source.addr(),
            },
        },
    })
    .unwrap();
    let _ = next(c.send_cq()).await;
    tokio::time::timeout(T, async {
        while s.error().is_none() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the Write to frozen bytes ends the stream");
    assert_eq!(s.pd().deregister(source), src, "the bytes are unchanged");
}

/// A run of large RDMA Writes, the first begun before its end arrived,
/// then a Send: each payload goes from the socket into its region, and the
/// Send completes after all of them were placed.
#[tokio::test]
async fn a_run_of_large_writes_is_placed_from_the_socket() {
    use iscsi_iwarp::wire::rdmap::Opcode;
    use tokio::io::AsyncWriteExt;
    let (mut raw, qp) = raw_peer(ConnectParams::default(), recvs(1, 64)).await;
    let mr = qp.pd().register(vec![0; 5 << 15], Access::REMOTE_WRITE);
    let mut stream = Vec::new();
    let mut expected = Vec::new();
    for i in 0..5u64 {
        // Odd lengths: pads of 1 to 3 bytes in the trailers.
        let payload: Vec<u8> = (0..(1 << 15) - i as usize)
            .map(|b| (b as u64 * 7 + i) as u8)
            .collect();
        let to = mr.addr() + (i << 15);
        stream.extend_from_slice(&fpdu(&tagged(Opcode::Write, mr.stag(), to), &[], &payload));
        expected.extend_from_slice(&payload);
        expected.resize(((i + 1) << 15) as usize, 0);
    }
    stream.extend_from_slice(&fpdu(
        &untagged(Opcode::Send, true, 0, 0, 1, 0),
        &[],
        b"done",
    ));
    let rest = stream.split_off(100);
    raw.write_all(&stream).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    raw.write_all(&rest).await.unwrap();
    let done = next(qp.recv_cq()).await;
    assert_eq!((done.status, done.byte_len), (WcStatus::Success, 4));
    assert!(qp.error().is_none(), "{:?}", qp.error());
    assert!(qp.pd().deregister(mr) == expected, "placed bytes differ");
}

/// The same run cut once at each place a TCP read can end: inside a
/// header, inside a payload, inside a pad or CRC, on an FPDU's boundary.
/// Whatever the reader holds when it decides to place a segment from the
/// socket (some of its trailer included), every byte lands where it belongs.
#[tokio::test]
async fn large_writes_cut_anywhere_are_placed() {
    use iscsi_iwarp::wire::rdmap::Opcode;
    use tokio::io::AsyncWriteExt;
    let mut lens = Vec::new();
    let mut template = Vec::new();
    for i in 0..3usize {
        // Lengths with pads of 3, 2 and 1 bytes.
        let payload: Vec<u8> = (0..(1 << 15) - 1 - i).map(|b| (b * 7 + i) as u8).collect();
        template.push(payload);
    }
    let mut cuts = vec![1, 10, 100];
    let mut at = 0;
    for payload in &template {
        let n = fpdu(&tagged(Opcode::Write, 0, 0), &[], payload).len();
        lens.push(n);
        for back in [1, 2, 4, 5, 6, 8] {
            cuts.push(at + n - back);
        }
        cuts.extend([at + n, at + n + 1, at + n + 15, at + n + 16, at + n + 17]);
        at += n;
    }
    for cut in cuts {
        let (mut raw, qp) = raw_peer(ConnectParams::default(), recvs(1, 64)).await;
        let mr = qp.pd().register(vec![0; 3 << 15], Access::REMOTE_WRITE);
        let mut stream = Vec::new();
        let mut expected = Vec::new();
        for (i, payload) in template.iter().enumerate() {
            let to = mr.addr() + ((i as u64) << 15);
            stream.extend_from_slice(&fpdu(&tagged(Opcode::Write, mr.stag(), to), &[], payload));
            expected.extend_from_slice(payload);
            expected.resize((i + 1) << 15, 0);
        }
        assert_eq!(stream.len(), lens.iter().sum::<usize>());
        stream.extend_from_slice(&fpdu(
            &untagged(Opcode::Send, true, 0, 0, 1, 0),
            &[],
            b"done",
        ));
        let rest = stream.split_off(cut);
        raw.write_all(&stream).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        raw.write_all(&rest).await.unwrap();
        let done = tokio::time::timeout(T, qp.recv_cq().next())
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("cut at {cut}: the Send never completed: {:?}", qp.error()));
        assert_eq!(
            (done.status, done.byte_len),
            (WcStatus::Success, 4),
            "cut at {cut}: {:?}",
            qp.error()
        );
        assert!(qp.error().is_none(), "cut at {cut}: {:?}", qp.error());
        assert!(
            qp.pd().deregister(mr) == expected,
            "cut at {cut}: placed bytes differ"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_reads_beyond_ord_wait_in_order() {
    let params = ConnectParams {
        ord: 2,
        ird: 2,
        ..Default::default()
    };
    let (c, s) = pair_with(params.clone(), params, vec![], vec![]).await;
    assert_eq!(c.ord(), 2);
    let n = 24usize;
    let chunk = 64 * 1024;
    let src: Vec<u8> = (0..(n * chunk) as u32).map(|i| (i / 977) as u8).collect();
    let source = s.pd().register(src.clone(), Access::REMOTE_READ);
    let sink = c.pd().register(vec![0; n * chunk], Access::LOCAL_WRITE);
    for i in 0..n {
        c.post_send(SendRequest {
            wr_id: i as u64,
            signaled: true,
            op: SendOp::RdmaRead {
                local: LocalBuffer {
                    stag: sink.stag(),
                    offset: i * chunk,
                    len: chunk,
                },
                remote: RemoteBuffer {
                    stag: source.stag(),
                    to: source.addr() + (i * chunk) as u64,
                },
            },
        })
        .unwrap();
    }
    for i in 0..n {
        let d = next(c.send_cq()).await;
        assert_eq!((d.wr_id, d.status), (i as u64, WcStatus::Success));
    }
    assert_eq!(c.pd().deregister(sink), src);
}

#[tokio::test]
async fn crc_choices() {
    for (a, b, want) in [
        (false, false, false),
        (true, false, true),
        (false, true, true),
        (true, true, true),
    ] {
        let (c, s) = pair_with(
            ConnectParams {
                crc: a,
                ..Default::default()
            },
            ConnectParams {
                crc: b,
                ..Default::default()
            },
            recvs(1, 64),
            recvs(1, 64),
        )
        .await;
        assert_eq!((c.peer().crc, s.peer().crc), (want, want));
        c.post_send(send(1, vec![bytes(b"x")])).unwrap();
        s.post_send(send(1, vec![bytes(b"y")])).unwrap();
        assert_eq!(next(s.recv_cq()).await.buffer.unwrap(), b"x");
        assert_eq!(next(c.recv_cq()).await.buffer.unwrap(), b"y");
    }
}

#[tokio::test]
async fn private_data_and_ird_ord_are_exchanged() {
    let (c, s) = pair_with(
        ConnectParams {
            private_data: vec![0x80, 0, 0, 0],
            ird: 128,
            ord: 1,
            ..Default::default()
        },
        ConnectParams {
            private_data: vec![0x40, 1, 2, 3],
            ird: 0,
            ord: 16,
            ..Default::default()
        },
        vec![],
        vec![],
    )
    .await;
    assert_eq!(s.peer().private_data, [0x80, 0, 0, 0]);
    assert_eq!(c.peer().private_data, [0x40, 1, 2, 3]);
    assert_eq!((s.peer().ird, s.peer().ord), (128, 1));
    // The responder's IRD is raised to the initiator's ORD, its ORD kept within the initiator's IRD.
    assert_eq!((c.peer().ird, c.peer().ord), (1, 16));
    assert_eq!((s.ird(), s.ord()), (1, 16));
}

#[tokio::test]
async fn queue_full() {
    let p = ConnectParams {
        caps: QpCaps {
            max_send_wr: 2,
            max_recv_wr: 1,
        },
        ..Default::default()
    };
    let (c, _s) = pair_with(p, ConnectParams::default(), recvs(1, 8), vec![]).await;
    // The current-thread runtime runs the writer only when we yield.
    c.post_send(send(1, vec![bytes(b"a")])).unwrap();
    c.post_send(send(2, vec![bytes(b"b")])).unwrap();
    assert_eq!(
        c.post_send(send(3, vec![bytes(b"c")])),
        Err(Error::QueueFull)
    );
    assert_eq!(
        c.post_recv(RecvRequest {
            wr_id: 9,
            buffer: vec![0; 8]
        }),
        Err(Error::QueueFull)
    );
    next(c.send_cq()).await;
    next(c.send_cq()).await;
    c.post_send(send(3, vec![bytes(b"c")])).unwrap();
}

#[tokio::test]
async fn disconnect_flushes_the_peer() {
    let (c, s) = pair(2, 0).await;
    s.disconnect().await;
    assert_eq!(s.error(), Some(Error::Closed));
    for _ in 0..2 {
        let f = next(c.recv_cq()).await;
        assert_eq!(f.status, WcStatus::Flushed);
        assert_eq!(f.buffer.map(|b| b.len()), Some(65536));
    }
    assert!(
        tokio::time::timeout(T, c.recv_cq().next())
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(c.error(), Some(Error::Closed));
    assert_eq!(c.post_send(send(1, vec![])), Err(Error::Closed));
}

#[tokio::test]
async fn local_misuse_is_reported() {
    let (c, _s) = pair(0, 0).await;
    let mr = c.pd().register(vec![0; 16], Access::LOCAL_WRITE);
    let e = c.post_send(send(
        1,
        vec![Sge::Region(LocalBuffer {
            stag: mr.stag(),
            offset: 8,
            len: 9,
        })],
    ));
    assert!(matches!(e, Err(Error::Misuse(_))));
    c.post_send(SendRequest {
        wr_id: 2,
        signaled: true,
        op: SendOp::LocalInvalidate { stag: mr.stag() },
    })
    .unwrap();
    assert_eq!(next(c.send_cq()).await.status, WcStatus::Success);
    assert!(!c.pd().is_valid(mr.stag()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "throughput check: cargo test -p iscsi-iwarp --release -- --ignored --nocapture"]
async fn throughput_writes_and_reads() {
    let (c, s) = pair(0, 0).await;
    let size = 1 << 20;
    let depth = 16;
    let total = 2048usize;
    let target = s.pd().register(
        vec![7; size * depth],
        Access::REMOTE_READ | Access::REMOTE_WRITE,
    );
    let local = c.pd().register(vec![1; size * depth], Access::LOCAL_WRITE);
    for read in [false, true] {
        let start = std::time::Instant::now();
        let mut posted = 0;
        let mut done = 0;
        while done < total {
            while posted < total && posted - done < depth {
                let slot = posted % depth;
                let local_buf = LocalBuffer {
                    stag: local.stag(),
                    offset: slot * size,
                    len: size,
                };
                let remote = RemoteBuffer {
                    stag: target.stag(),
                    to: target.addr() + (slot * size) as u64,
                };
                let op = if read {
                    SendOp::RdmaRead {
                        local: local_buf,
                        remote,
                    }
                } else {
                    SendOp::RdmaWrite {
                        data: vec![Sge::Region(local_buf)],
                        remote,
                    }
                };
                c.post_send(SendRequest {
                    wr_id: posted as u64,
                    signaled: true,
                    op,
                })
                .unwrap();
                posted += 1;
            }
            next(c.send_cq()).await;
            done += 1;
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{}: {:.0} MiB/s",
            if read { "reads" } else { "writes" },
            total as f64 / secs
        );
    }
}
