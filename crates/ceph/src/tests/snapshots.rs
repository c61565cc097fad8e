//! Snapshots of an RBD LU (`snapshots.rs`) against the cluster. Each
//! `unsafe` block of `ffi/snap.rs` runs here: snapshot exists, create,
//! list (and its end), timestamp, remove, protect, unprotect, is
//! protected, the children of a snapshot (open read-only at it, list,
//! cleanup, close), a pool context, an image's existence, clone in both
//! formats (its options object), metadata set and remove; and the image
//! opened read-only at a snapshot (`ffi/mod.rs`).

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use iscsi_scsi::backstore::{SnapshotError, Snapshots};

use super::super::*;
use super::{TestImage, conf, resize};

/// `rbd ARGS` on the test cluster: its output, or a panic with its words.
fn rbd(args: &[&str]) -> String {
    let out = Command::new("rbd")
        .args(["-c", &conf()])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rbd {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What `rbd rm` of a test image needs first, done on drop (declared after
/// the [`TestImage`], so dropped before it): its clones removed, the
/// snapshots named unprotected, every snapshot purged. Errors are ignored
/// (most of it is gone already when the test passed).
struct Purge {
    image: String,
    clones: Vec<String>,
    protected: Vec<String>,
}

impl Purge {
    fn new(image: &TestImage, clones: &[&str], protected: &[&str]) -> Purge {
        let purge = Purge {
            image: format!("rbd/{}", image.0),
            clones: clones.iter().map(|c| format!("rbd/{c}")).collect(),
            protected: protected.iter().map(|s| (*s).to_owned()).collect(),
        };
        // Left behind by an earlier run that failed.
        for clone in &purge.clones {
            quiet(&["rm", clone]);
        }
        purge
    }
}

fn quiet(args: &[&str]) {
    let _ = Command::new("rbd")
        .args(["-c", &conf()])
        .args(args)
        .output();
}

impl Drop for Purge {
    fn drop(&mut self) {
        for clone in &self.clones {
            quiet(&["rm", clone]);
        }
        for snap in &self.protected {
            quiet(&["snap", "unprotect", &format!("{}@{snap}", self.image)]);
        }
        quiet(&["snap", "purge", &self.image]);
    }
}

const BLOCK: usize = 4096;

/// What block `block` holds once written: its number in every word, never
/// zeros, so that a block reads as all of it or as never written.
fn block_pattern(block: u64) -> Vec<u8> {
    let word = (block | 1 << 63).to_le_bytes();
    word.iter().copied().cycle().take(BLOCK).collect()
}

/// One acknowledged write: its block, when it was issued and when it was
/// acknowledged, and by which writer (`usize::MAX`: the asynchronous one,
/// with several writes in flight at once).
struct Done {
    block: u64,
    issued: Instant,
    acked: Instant,
    writer: usize,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Whether `bytes` are all `value`.
fn all(bytes: &[u8], value: u8) -> bool {
    bytes.iter().all(|&b| b == value)
}

/// Crash consistency: writers (three synchronous, one asynchronous with
/// eight writes in flight) write distinct blocks while the snapshot is
/// taken. The snapshot holds every write acknowledged before `take` was
/// called, none issued after it returned, each block whole or not at all,
/// and of each synchronous writer's writes (each issued after the one
/// before was acknowledged) a prefix.
#[test]
fn a_snapshot_taken_under_writes_holds_what_a_power_cut_would() {
    let image = TestImage::new("snap-cc", "64M");
    let _purge = Purge::new(&image, &[], &[]);
    let store = Arc::new(RbdBackstore::open(&image.spec(), 512).unwrap());
    let size = store.size_bytes();
    let blocks = size / BLOCK as u64;
    const SYNC_WRITERS: u64 = 3;
    const WRITERS: u64 = SYNC_WRITERS + 1;
    let stop = Arc::new(AtomicBool::new(false));
    let log = Arc::new(Mutex::new(Vec::<Done>::new()));
    let mut threads = Vec::new();
    for writer in 0..SYNC_WRITERS {
        let (store, stop, log) = (Arc::clone(&store), Arc::clone(&stop), Arc::clone(&log));
        threads.push(std::thread::spawn(move || {
            let mut mine = Vec::new();
            let mut block = writer;
            while !stop.load(Ordering::Acquire) && block < blocks {
                let issued = Instant::now();
                store
                    .write_at(block * BLOCK as u64, &block_pattern(block))
                    .unwrap();
                mine.push(Done {
                    block,
                    issued,
                    acked: Instant::now(),
                    writer: writer as usize,
                });
                block += WRITERS;
            }
            log.lock().unwrap().extend(mine);
        }));
    }
    {
        let (store, stop, log) = (Arc::clone(&store), Arc::clone(&stop), Arc::clone(&log));
        threads.push(std::thread::spawn(move || {
            let io = store.async_io().unwrap();
            let mut mine = Vec::new();
            let mut next = SYNC_WRITERS;
            runtime().block_on(async {
                while !stop.load(Ordering::Acquire) && next < blocks {
                    let mut set = tokio::task::JoinSet::new();
                    while set.len() < 8 && next < blocks {
                        let (io, block) = (Arc::clone(&io), next);
                        next += WRITERS;
                        set.spawn(async move {
                            // The request is made at the first poll, after this.
                            let issued = Instant::now();
                            let data = Box::new(block_pattern(block));
                            io.write(block * BLOCK as u64, data, BLOCK, false)
                                .await
                                .unwrap();
                            Done {
                                block,
                                issued,
                                acked: Instant::now(),
                                writer: usize::MAX,
                            }
                        });
                    }
                    while let Some(done) = set.join_next().await {
                        mine.push(done.unwrap());
                    }
                }
            });
            log.lock().unwrap().extend(mine);
        }));
    }
    std::thread::sleep(Duration::from_millis(400));
    let called = Instant::now();
    let info = store.take("under-writes").unwrap();
    let returned = Instant::now();
    std::thread::sleep(Duration::from_millis(400));
    stop.store(true, Ordering::Release);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(info.name, "under-writes");
    assert_eq!(info.size_bytes, size);
    assert_eq!(info.held_bytes, None);
    let taken = info.taken_unix.expect("librbd records when");
    assert!(taken.abs_diff(unix_now()) < 300, "{taken}");

    let snapshot = store.open("under-writes", 7).unwrap();
    let mut frozen = vec![0u8; size as usize];
    for (i, piece) in frozen.chunks_mut(4 << 20).enumerate() {
        snapshot.read_at(i as u64 * (4 << 20), piece).unwrap();
    }
    let mut head = vec![0u8; size as usize];
    for (i, piece) in head.chunks_mut(4 << 20).enumerate() {
        store.read_at(i as u64 * (4 << 20), piece).unwrap();
    }
    let mut log = std::mem::take(&mut *log.lock().unwrap());
    log.sort_by_key(|d| d.block);
    let (mut before, mut after, mut between, mut held) = (0, 0, 0, 0);
    let mut prefix_ended = [false; SYNC_WRITERS as usize];
    for d in &log {
        let at = d.block as usize * BLOCK;
        let want = block_pattern(d.block);
        assert_eq!(head[at..at + BLOCK], want[..], "block {} lost", d.block);
        let got = &frozen[at..at + BLOCK];
        let in_it = got == &want[..];
        assert!(
            in_it || all(got, 0),
            "block {} torn in the snapshot",
            d.block
        );
        held += usize::from(in_it);
        if d.acked < called {
            before += 1;
            assert!(
                in_it,
                "block {} acknowledged before take() is missing",
                d.block
            );
        } else if d.issued > returned {
            after += 1;
            assert!(
                !in_it,
                "block {} issued after take() returned is in it",
                d.block
            );
        } else {
            between += 1;
        }
        // Blocks in increasing order are each synchronous writer's writes
        // in the order it made them.
        if d.writer != usize::MAX {
            let ended = &mut prefix_ended[d.writer];
            assert!(
                !(in_it && *ended),
                "writer {}: block {} is in the snapshot after an earlier write of the same \
                 writer is not",
                d.writer,
                d.block
            );
            *ended |= !in_it;
        }
    }
    // Blocks nobody wrote read as zeros in both.
    let written: std::collections::HashSet<u64> = log.iter().map(|d| d.block).collect();
    for block in (0..blocks).filter(|b| !written.contains(b)) {
        let at = block as usize * BLOCK;
        assert!(all(&frozen[at..at + BLOCK], 0) && all(&head[at..at + BLOCK], 0));
    }
    assert!(
        before > 0 && after > 0,
        "the writes did not span the snapshot: {before} before, {after} after"
    );
    eprintln!(
        "{} writes: {before} acknowledged before take(), {after} issued after it returned, \
         {between} in between; the snapshot holds {held}",
        log.len()
    );
}

/// A snapshot served read-only: its size, its data, every write refused;
/// one name twice; bad names; the list; a missing name; delete refused
/// while served.
#[test]
fn a_snapshot_opens_read_only_at_its_own_size_and_lists_with_it() {
    let image = TestImage::new("snap-ro", "16M");
    let _purge = Purge::new(&image, &[], &[]);
    let store = RbdBackstore::open(&image.spec(), 512).unwrap();
    let snaps = store.snapshots().expect("an RBD store takes snapshots");
    store.write_at(0, &[0xA1; 8192]).unwrap();
    let first = snaps.take("first").unwrap();
    assert_eq!(first.size_bytes, 16 << 20);
    assert!(
        first
            .taken_unix
            .is_some_and(|t| t.abs_diff(unix_now()) < 300)
    );
    store.write_at(0, &[0xB2; 8192]).unwrap();

    // One name twice: refused, and the first keeps what it holds.
    match snaps.take("first") {
        Err(SnapshotError::Exists(n)) => assert_eq!(n, "first"),
        other => panic!("{other:?}"),
    }
    let long = "x".repeat(65);
    for bad in ["", "a/b", ".hidden", "-rf", "snap@1", "a b", long.as_str()] {
        let refused = |r: Result<(), SnapshotError>| match r {
            Err(SnapshotError::BadName(n)) => assert_eq!(n, bad),
            other => panic!("{bad:?}: {other:?}"),
        };
        refused(snaps.take(bad).map(drop));
        refused(snaps.open(bad, 1).map(drop));
        refused(snaps.delete(bad));
        refused(snaps.clone_into(bad, Some("anything"), 1).map(drop));
    }

    // Grown, then a second snapshot: each keeps its own size.
    resize(&image, "32M");
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.block_count() != 32 << 11 {
        assert!(Instant::now() < deadline, "resize not seen");
        store.poll_size_now();
        std::thread::sleep(Duration::from_millis(50));
    }
    store.write_at(20 << 20, &[0xC3; 4096]).unwrap();
    let second = snaps.take("second").unwrap();
    assert_eq!(second.size_bytes, 32 << 20);
    let list = snaps.list().unwrap();
    let seen: Vec<(&str, u64)> = list
        .iter()
        .map(|s| (s.name.as_str(), s.size_bytes))
        .collect();
    assert_eq!(seen, [("first", 16 << 20), ("second", 32 << 20)]);
    assert!(list.iter().all(|s| s.taken_unix.is_some()), "{list:?}");
    assert_eq!(list[0], first, "the refused second take changed nothing");

    let ro = snaps.open("first", 4242).unwrap();
    assert_eq!(ro.block_size(), 512);
    assert_eq!(ro.block_count(), 16 << 11);
    assert_eq!(ro.unique_id(), 4242);
    assert!(ro.lu_options().read_only && ro.is_thin());
    assert!(ro.snapshots().is_none());
    let mut back = vec![0u8; 8192];
    ro.read_at(0, &mut back).unwrap();
    assert!(
        all(&back, 0xA1),
        "the snapshot holds what was written before it"
    );
    assert!(ro.read_at(16 << 20, &mut back[..512]).is_err());
    let e = ro.write_at(0, &[1; 512]).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ReadOnlyFilesystem);
    assert!(
        e.to_string().contains("@first") && e.to_string().contains("read-only"),
        "{e}"
    );
    for e in [
        ro.write_through(0, &[1; 512]).unwrap_err(),
        ro.write_pieces(0, &mut [vec![1; 512]], 512).unwrap_err(),
        ro.unmap(0, 4096).unwrap_err(),
    ] {
        assert_eq!(e.kind(), io::ErrorKind::ReadOnlyFilesystem, "{e}");
    }
    ro.flush().unwrap();
    assert!(ro.allocation_status(0, 16 << 20).unwrap().mapped);
    let io = ro.async_io().unwrap();
    let rt = runtime();
    let (buf, r) = rt.block_on(io.read(4096, vec![0; 4096]));
    r.unwrap();
    assert!(all(&buf, 0xA1));
    let e = rt
        .block_on(io.write(0, Box::new(vec![1u8; 512]), 512, true))
        .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ReadOnlyFilesystem);
    // The snapshot still as it was, the head as written.
    ro.read_at(0, &mut back).unwrap();
    assert!(all(&back, 0xA1));
    store.read_at(0, &mut back).unwrap();
    assert!(all(&back, 0xB2));
    let two = snaps.open("second", 4243).unwrap();
    assert_eq!(two.block_count(), 32 << 11);
    two.read_at(0, &mut back).unwrap();
    assert!(all(&back, 0xB2));
    two.read_at(20 << 20, &mut back[..4096]).unwrap();
    assert!(all(&back[..4096], 0xC3));

    // Missing names.
    for r in [
        snaps.open("missing", 1).map(drop),
        snaps.delete("missing"),
        snaps.clone_into("missing", Some("never-made"), 1).map(drop),
    ] {
        match r {
            Err(SnapshotError::NotFound(n)) => assert_eq!(n, "missing"),
            other => panic!("{other:?}"),
        }
    }
    assert!(
        !rbd(&["ls", "rbd"]).lines().any(|l| l == "never-made"),
        "no clone of a missing snapshot"
    );

    // Served as a LUN: refused until that LUN goes.
    match snaps.delete("first") {
        Err(e @ SnapshotError::InUse { .. }) => {
            assert!(e.to_string().contains("serves it as a LUN"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    drop(ro);
    snaps.delete("first").unwrap();
    let names: Vec<String> = snaps.list().unwrap().into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["second"]);
    assert!(matches!(
        snaps.open("first", 1),
        Err(SnapshotError::NotFound(_))
    ));
    // The other snapshot and the head are untouched.
    two.read_at(0, &mut back).unwrap();
    assert!(all(&back, 0xB2));
    drop(two);
    snaps.delete("second").unwrap();
    assert!(snaps.list().unwrap().is_empty());
}

/// A clone (format 2): writable, apart from its snapshot and origin;
/// opened as it is when it exists; the snapshot's delete refused while it
/// lives, naming it.
#[test]
fn a_clone_writes_apart_from_its_snapshot_and_is_reopened_as_it_is() {
    let image = TestImage::new("snap-clone", "16M");
    let clone_name = format!("{}-clone", image.0);
    let _purge = Purge::new(&image, &[&clone_name], &[]);
    let store = RbdBackstore::open(&image.spec(), 512).unwrap();
    store.write_at(0, &[0xA1; 4096]).unwrap();
    store.write_at(5 << 20, &[0xA2; 4096]).unwrap();
    store.take("base").unwrap();
    store.write_at(0, &[0xB1; 4096]).unwrap();

    match store.clone_into("base", None, 1) {
        Err(SnapshotError::Unsupported(words)) => {
            assert!(words.contains("to=IMAGE"), "{words}")
        }
        other => panic!("{other:?}"),
    }
    match store.clone_into("base", Some("a/b/c"), 1) {
        Err(e @ SnapshotError::Io(_)) => assert!(e.to_string().contains("POOL/IMAGE"), "{e}"),
        other => panic!("{other:?}"),
    }
    match store.clone_into("base", Some("no-such-pool/x"), 1) {
        Err(e @ SnapshotError::Io(_)) => {
            assert!(e.to_string().contains("no pool \"no-such-pool\""), "{e}")
        }
        other => panic!("{other:?}"),
    }

    let clone = store.clone_into("base", Some(&clone_name), 900).unwrap();
    assert_eq!(clone.unique_id(), 900);
    assert_eq!(clone.block_count(), 16 << 11);
    assert!(!clone.lu_options().read_only);
    let info = rbd(&["info", "--format", "json", &format!("rbd/{clone_name}")]);
    assert!(
        info.contains(&format!("\"image\":\"{}\"", image.0))
            && info.contains("\"snapshot\":\"base\"")
            && info.contains("clone-child"),
        "a clone of format 2 of base: {info}"
    );
    let mut back = vec![0u8; 4096];
    clone.read_at(0, &mut back).unwrap();
    assert!(all(&back, 0xA1));
    clone.write_at(0, &[0xC1; 4096]).unwrap();
    clone.read_at(0, &mut back).unwrap();
    assert!(all(&back, 0xC1));
    clone.read_at(5 << 20, &mut back).unwrap();
    assert!(
        all(&back, 0xA2),
        "what the clone did not write comes from the snapshot"
    );
    // The origin and the snapshot are as they were.
    store.read_at(0, &mut back).unwrap();
    assert!(all(&back, 0xB1));
    let snapshot = store.open("base", 2).unwrap();
    snapshot.read_at(0, &mut back).unwrap();
    assert!(all(&back, 0xA1));
    drop(snapshot);

    // Exists: opened as it is (its own write, not the snapshot's data),
    // named with or without its pool.
    drop(clone);
    for to in [clone_name.clone(), format!("rbd/{clone_name}")] {
        let again = store.clone_into("base", Some(&to), 901).unwrap();
        again.read_at(0, &mut back).unwrap();
        assert!(all(&back, 0xC1), "{to}");
    }

    // The snapshot cannot go while the clone needs it; nothing changes.
    match store.delete("base") {
        Err(e @ SnapshotError::InUse { .. }) => {
            let words = e.to_string();
            assert!(
                words.contains(&format!("rbd/{clone_name}")) && words.contains("rbd flatten"),
                "{words}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(store.list().unwrap().len(), 1);
    let again = store.clone_into("base", Some(&clone_name), 901).unwrap();
    again.read_at(5 << 20, &mut back).unwrap();
    assert!(all(&back, 0xA2));
    drop(again);
    rbd(&["rm", &format!("rbd/{clone_name}")]);
    store.delete("base").unwrap();
    assert!(store.list().unwrap().is_empty());
}

/// The fallback for a cluster that refuses clones of format 2: the
/// snapshot protected (and noted so) for a clone of format 1, and
/// unprotected by delete once the clone is gone; a snapshot the operator
/// protected is left to the operator.
#[test]
fn a_clone_of_format_1_protects_the_snapshot_and_delete_unprotects_only_its_own() {
    let image = TestImage::new("snap-v1", "16M");
    let clone_name = format!("{}-clone", image.0);
    let _purge = Purge::new(&image, &[&clone_name], &["v1", "theirs"]);
    let store = RbdBackstore::open(&image.spec(), 512).unwrap();
    store.write_at(0, &[0xD1; 4096]).unwrap();
    store.take("v1").unwrap();
    let c = store.snap_client().unwrap();
    let note = format!("{}v1", crate::snapshots::PROTECTED_BY_US);
    store
        .clone_format_1(&c, "v1", "rbd", &clone_name)
        .map_err(|(step, e)| format!("{step}: {e}"))
        .unwrap();
    assert!(c.image.snap_is_protected("v1").unwrap());
    assert_eq!(c.image.metadata(&note).unwrap().as_deref(), Some("1"));
    let info = rbd(&["info", "--format", "json", &format!("rbd/{clone_name}")]);
    assert!(
        info.contains("\"snapshot\":\"v1\"") && !info.contains("clone-child"),
        "a clone of format 1: {info}"
    );
    // Made already: opened as it is.
    let clone = store.clone_into("v1", Some(&clone_name), 5).unwrap();
    let mut back = vec![0u8; 4096];
    clone.read_at(0, &mut back).unwrap();
    assert!(all(&back, 0xD1));
    drop(clone);
    match store.delete("v1") {
        Err(e @ SnapshotError::InUse { .. }) => {
            assert!(e.to_string().contains(&clone_name), "{e}")
        }
        other => panic!("{other:?}"),
    }
    assert!(c.image.snap_is_protected("v1").unwrap(), "still protected");
    rbd(&["rm", &format!("rbd/{clone_name}")]);
    store.delete("v1").unwrap();
    assert_eq!(c.image.metadata(&note).unwrap(), None);
    assert!(!c.image.snap_exists("v1").unwrap());

    // Protected by the operator: left to the operator, in words.
    store.take("theirs").unwrap();
    rbd(&["snap", "protect", &format!("rbd/{}@theirs", image.0)]);
    match store.delete("theirs") {
        Err(e @ SnapshotError::InUse { .. }) => {
            assert!(e.to_string().contains("rbd snap unprotect"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    assert!(c.image.snap_is_protected("theirs").unwrap());
    rbd(&["snap", "unprotect", &format!("rbd/{}@theirs", image.0)]);
    store.delete("theirs").unwrap();
    assert!(store.list().unwrap().is_empty());
}
