//! The asynchronous path (`ffi/aio.rs`): each of its `unsafe` blocks runs
//! here — the event socket's registration, completion creation, the read,
//! the write in one buffer (with FUA) and in pieces, polling, the
//! release of completions reaped and of a submission that failed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::super::*;
use super::TestImage;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Pieces as a write's data; `dropped` says when the store let go of them.
struct Pieces(Vec<Vec<u8>>, Option<Arc<AtomicBool>>);

impl WriteData for Pieces {
    fn slices(&self) -> Vec<&[u8]> {
        self.0.iter().map(Vec::as_slice).collect()
    }
}

impl Drop for Pieces {
    fn drop(&mut self) {
        if let Some(dropped) = &self.1 {
            dropped.store(true, Ordering::Release);
        }
    }
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(31) ^ seed) as u8)
        .collect()
}

#[test]
fn aio_reads_and_writes_in_one_buffer_and_in_pieces_across_objects() {
    let image = TestImage::new("aio-rw", "16M");
    let store = RbdBackstore::open(&image.spec(), 512).unwrap();
    let io = store
        .async_io()
        .expect("an RBD store offers asynchronous I/O");
    let rt = runtime();
    // One buffer, FUA, across the first 4 MiB object boundary.
    let at = (4 << 20) - 8192;
    let data = pattern(16384, 1);
    rt.block_on(io.write(at, Box::new(data.clone()), data.len(), true))
        .unwrap();
    let mut back = vec![0u8; data.len()];
    store.read_at(at, &mut back).unwrap();
    assert_eq!(
        back, data,
        "the synchronous read sees the asynchronous write"
    );
    let (seen, r) = rt.block_on(io.read(at, vec![0xEE; data.len()]));
    r.unwrap();
    assert_eq!(seen, data);
    // Pieces (one rbd_aio_writev), the last one cut by the length.
    let pieces: Vec<Vec<u8>> = (0..5).map(|i| pattern(65536, 10 + i)).collect();
    let len = 5 * 65536 - 512;
    let edge = (8 << 20) - 2 * 65536;
    rt.block_on(io.write(edge, Box::new(Pieces(pieces.clone(), None)), len, false))
        .unwrap();
    let (seen, r) = rt.block_on(io.read(edge, vec![0; 5 * 65536]));
    r.unwrap();
    assert_eq!(seen[..len], pieces.concat()[..len]);
    assert!(
        seen[len..].iter().all(|&b| b == 0),
        "nothing past the length"
    );
    // Data shorter than its length: refused before librbd sees it.
    let short = rt.block_on(io.write(0, Box::new(vec![1u8; 512]), 1024, false));
    assert_eq!(short.unwrap_err().kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn aio_many_requests_in_flight_each_complete_with_their_own_data() {
    let image = TestImage::new("aio-many", "16M");
    let store = RbdBackstore::open(&image.spec(), 512).unwrap();
    let io = store.async_io().unwrap();
    let rt = runtime();
    let blocks: Vec<(u64, Vec<u8>)> = (0..128u32)
        .map(|i| (u64::from(i) * 65536 + 4096, pattern(4096, i)))
        .collect();
    rt.block_on(async {
        let writes: Vec<_> = blocks
            .iter()
            .map(|(at, data)| io.write(*at, Box::new(data.clone()), data.len(), false))
            .collect();
        for w in writes {
            w.await.unwrap();
        }
        let reads: Vec<_> = blocks
            .iter()
            .map(|(at, data)| io.read(*at, vec![0; data.len()]))
            .collect();
        for (read, (at, data)) in reads.into_iter().zip(&blocks) {
            let (seen, r) = read.await;
            r.unwrap();
            assert_eq!(&seen, data, "block at {at}");
        }
    });
}

#[test]
fn aio_a_request_whose_future_is_dropped_still_lands_and_frees_its_buffer() {
    let image = TestImage::new("aio-drop", "16M");
    let store = RbdBackstore::open(&image.spec(), 512).unwrap();
    let io = store.async_io().unwrap();
    // One thread: the reaper (spawned on this runtime by the first
    // request) cannot run while the test's task is being polled, so the
    // write is still in flight when its first poll returns — however
    // fast the OSD, however loaded the machine (a timer here once let a
    // loaded machine complete the write before the drop).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let data = pattern(1 << 20, 7);
    let dropped = Arc::new(AtomicBool::new(false));
    rt.block_on(async {
        // Submitted at its first poll, then dropped: the table keeps the
        // data until librbd is done with it (ffi/aio.rs, invariant 6).
        let mut write = io.write(
            0,
            Box::new(Pieces(vec![data.clone()], Some(Arc::clone(&dropped)))),
            data.len(),
            false,
        );
        let first =
            std::future::poll_fn(|cx| std::task::Poll::Ready(write.as_mut().poll(cx))).await;
        assert!(first.is_pending(), "only the reaper completes a request");
        assert!(!dropped.load(Ordering::Acquire), "held while in flight");
        drop(write);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !dropped.load(Ordering::Acquire) {
            assert!(Instant::now() < deadline, "the buffer was never let go");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let mut back = vec![0u8; data.len()];
    store.read_at(0, &mut back).unwrap();
    assert_eq!(back, data, "the write whose future was dropped landed");
}

#[test]
fn aio_a_short_read_past_the_end_is_an_error() {
    let image = TestImage::new("aio-end", "4M");
    let store = RbdBackstore::open(&image.spec(), 512).unwrap();
    let rt = runtime();
    // Past the range check of the store, straight to librbd, which reads
    // to the end and reports fewer bytes.
    let end = 4u64 << 20;
    let (_, r) = rt.block_on(store.shared.image().aio_read(end - 512, vec![0; 4096]));
    let e = r.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e:?}");
    // Through the store: refused by its range check, with no request made.
    let io = store.async_io().unwrap();
    let (_, r) = rt.block_on(io.read(end - 512, vec![0; 4096]));
    assert!(r.is_err());
}

#[test]
fn aio_outside_a_runtime_fails_cleanly_and_a_new_runtime_takes_over() {
    let image = TestImage::new("aio-rt", "4M");
    let store = RbdBackstore::open(&image.spec(), 512).unwrap();
    let io = store.async_io().unwrap();
    // Polled outside any runtime: no reaper can start, so no request is
    // made, and the error says why.
    let mut outside = io.write(0, Box::new(vec![3u8; 4096]), 4096, false);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let std::task::Poll::Ready(Err(e)) = outside.as_mut().poll(&mut cx) else {
        panic!("a request polled outside a runtime did not fail at once");
    };
    assert!(e.to_string().contains("runtime"), "{e}");
    let first = runtime();
    // The first runtime's reaper serves; once that runtime is gone, the
    // next request starts a reaper on its own runtime.
    first
        .block_on(io.write(0, Box::new(vec![4u8; 4096]), 4096, false))
        .unwrap();
    drop(first);
    let second = runtime();
    let (seen, r) = second.block_on(io.read(0, vec![0; 4096]));
    r.unwrap();
    assert!(seen.iter().all(|&b| b == 4));
}
