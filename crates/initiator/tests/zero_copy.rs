//! The target sends READ data straight from the RAM store's chunks (no
//! copy): a write that lands while a read's data is still on its way must
//! not show through. Readers and writers race on the same megabyte, over
//! TCP and over iSER; every block of a read must come from one and the same
//! write (the store lends a read a snapshot of its chunks, and a write
//! copies a chunk that is still lent instead of changing it), and a read
//! issued after a write was acknowledged sees that write or a later one.
//! With CRC32C data digests on, the digest of a whole chunk is the CRC the
//! chunk remembers: a write must make it forget, or the initiator sees a
//! digest error (and, at ErrorRecoveryLevel 0, reinstates the session,
//! which the test counts).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use iscsi_initiator::{IscsiUrl, Session, SessionConfig};
use iscsi_scsi::Backstore;
use iscsi_stores::RamBackstore;

const TARGET: &str = "iqn.2026-11.rs.iscsi:zero-copy-tests";
const BLOCK: u32 = 512;
/// One megabyte: 16 of the RAM store's 64 KiB chunks.
const LEN: usize = 1 << 20;

/// Every block of generation `generation`: the generation in its first 8
/// bytes, then a pattern derived from it and the block's index.
fn generation_data(generation: u64) -> Vec<u8> {
    let mut data = vec![0u8; LEN];
    for (i, block) in data.chunks_mut(BLOCK as usize).enumerate() {
        block[..8].copy_from_slice(&generation.to_le_bytes());
        for (j, b) in block[8..].iter_mut().enumerate() {
            *b = (generation as usize)
                .wrapping_mul(31)
                .wrapping_add(i * 7 + j) as u8;
        }
    }
    data
}

/// The one generation all of `data` was written by; panics otherwise.
fn generation_of(data: &[u8]) -> u64 {
    let generation = u64::from_le_bytes(data[..8].try_into().unwrap());
    assert!(
        data == generation_data(generation),
        "a read mixed writes: its first block is generation {generation}, other bytes are not"
    );
    generation
}

async fn race(url: IscsiUrl, digests: bool) {
    let mut config = SessionConfig::default();
    if digests {
        config.set("HeaderDigest", "CRC32C").unwrap();
        config.set("DataDigest", "CRC32C").unwrap();
    }
    let session = Arc::new(Session::connect(&url, config).await.unwrap());
    session
        .write(0, 0, BLOCK, &generation_data(1))
        .await
        .expect("first write");
    let acknowledged = Arc::new(AtomicU64::new(1));
    let mut tasks = tokio::task::JoinSet::new();
    {
        // One writer, so that the latest acknowledged write is the one the
        // LUN holds until the next.
        let session = Arc::clone(&session);
        let acknowledged = Arc::clone(&acknowledged);
        tasks.spawn(async move {
            for generation in 2..90u64 {
                let data = generation_data(generation);
                session.write(0, 0, BLOCK, &data).await.expect("write");
                acknowledged.store(generation, Ordering::SeqCst);
            }
        });
    }
    for _ in 0..4 {
        let session = Arc::clone(&session);
        let acknowledged = Arc::clone(&acknowledged);
        tasks.spawn(async move {
            for _ in 0..60 {
                let floor = acknowledged.load(Ordering::SeqCst);
                let data = session.read(0, 0, BLOCK, vec![0; LEN]).await.expect("read");
                let generation = generation_of(&data);
                assert!(
                    generation >= floor,
                    "read generation {generation} after {floor} was acknowledged"
                );
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    assert_eq!(
        session.reinstatements(),
        0,
        "a digest error (or a lost connection) made the session start again"
    );
    session.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_racing_writes_never_show_later_data() {
    let lun: Arc<dyn Backstore> = Arc::new(RamBackstore::new(16 << 20, BLOCK, 7).unwrap());
    let (tcp, iser, _stop) = common::our_target(TARGET, vec![lun], 64).await;
    race(format!("iscsi://{tcp}/{TARGET}/0").parse().unwrap(), false).await;
    race(format!("iscsi://{tcp}/{TARGET}/0").parse().unwrap(), true).await;
    race(format!("iser://{iser}/{TARGET}/0").parse().unwrap(), false).await;
}

/// Writes of a RAM LUN are received into pieces of its 64 KiB chunks,
/// which the store keeps as its own where a piece lands on a whole chunk
/// and copies elsewhere: at every alignment and length (unsolicited data,
/// R2T bursts cutting pieces, a piece shared by two Data-Outs), over TCP
/// and iSER, what is read back is what was written, and the bytes around
/// each write are untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_received_in_pieces_land_at_every_alignment() {
    let lun: Arc<dyn Backstore> = Arc::new(RamBackstore::new(16 << 20, BLOCK, 7).unwrap());
    let (tcp, iser, _stop) = common::our_target(TARGET, vec![lun], 64).await;
    let urls = [
        format!("iscsi://{tcp}/{TARGET}/0"),
        format!("iser://{iser}/{TARGET}/0"),
    ];
    let mut seed = 1u8;
    for url in urls {
        let url: IscsiUrl = url.parse().unwrap();
        let mut config = SessionConfig::default();
        // Bursts and segments that do not fall on chunk boundaries.
        config.set("MaxBurstLength", "98304").unwrap();
        config.set("FirstBurstLength", "40960").unwrap();
        config.set("MaxRecvDataSegmentLength", "24576").unwrap();
        let session = Session::connect(&url, config).await.unwrap();
        let chunk_blocks = (64 * 1024 / BLOCK) as u64;
        for (lba, len) in [
            (0, 64 * 1024),
            (chunk_blocks, 64 * 1024 + 512),
            (1, 1 << 20),
            (chunk_blocks * 3 - 1, (1 << 20) - 512),
            (chunk_blocks * 40, 3 << 20),
            (chunk_blocks * 100 + 7, 200 * 1024),
        ] {
            let lba: u64 = lba;
            let around = 64 * 1024;
            let start = (lba * u64::from(BLOCK)).saturating_sub(around as u64) / u64::from(BLOCK);
            let span = (lba - start) as usize * BLOCK as usize + len + around;
            let before = session.read(0, start, BLOCK, vec![0; span]).await.unwrap();
            seed = seed.wrapping_add(1);
            let data: Vec<u8> = (0..len)
                .map(|i| (i as u8).wrapping_mul(seed) ^ (i >> 9) as u8)
                .collect();
            session.write(0, lba, BLOCK, &data).await.unwrap();
            let after = session.read(0, start, BLOCK, vec![0; span]).await.unwrap();
            let at = (lba - start) as usize * BLOCK as usize;
            assert_eq!(
                &after[..at],
                &before[..at],
                "{url}: bytes before lba {lba} changed"
            );
            assert!(
                after[at..at + len] == data[..],
                "{url}: lba {lba} len {len} read back wrong"
            );
            assert_eq!(
                &after[at + len..],
                &before[at + len..],
                "{url}: bytes after lba {lba} len {len} changed"
            );
        }
        session.logout().await.unwrap();
    }
}
