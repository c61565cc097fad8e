//! `ScsiTarget::plan_io`: a READ or WRITE on a store with asynchronous
//! I/O is checked exactly as `execute` checks it, and only its transfer
//! is left to the caller (`PlannedIo`). The store here is a RAM disk whose
//! asynchronous I/O the test can hold back or fail.

mod common;

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use iscsi_scsi::{
    AsyncIo, Backstore, CommandOutcome, DataOut, IoFuture, Planned, PlannedIo, ScsiTarget, Sense,
    Transfer, WriteData, encode_lun, status,
};
use iscsi_stores::RamBackstore;
use tokio::sync::oneshot;

/// A RAM disk with asynchronous I/O: a write waits for `gate` when one is
/// set; `fail` makes the next request fail with that errno.
struct Store {
    ram: Arc<RamBackstore>,
    io: Arc<Io>,
    /// When set, a synchronous read says it started, then waits to be let go.
    read_gate: Mutex<Option<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Store")
    }
}

struct Io {
    ram: Arc<RamBackstore>,
    gate: Mutex<Option<oneshot::Receiver<()>>>,
    fail: Mutex<Option<i32>>,
    /// When set, `ready` (after an "again soon") waits for it.
    ready_gate: Mutex<Option<oneshot::Receiver<()>>>,
}

impl AsyncIo for Io {
    fn read(&self, offset: u64, mut buf: Vec<u8>) -> IoFuture<(Vec<u8>, io::Result<()>)> {
        if let Some(errno) = self.fail.lock().unwrap().take() {
            return Box::pin(std::future::ready((
                buf,
                Err(io::Error::from_raw_os_error(errno)),
            )));
        }
        let r = self.ram.read_at(offset, &mut buf);
        Box::pin(std::future::ready((buf, r)))
    }

    fn write(
        &self,
        offset: u64,
        data: Box<dyn WriteData>,
        len: usize,
        _through: bool,
    ) -> IoFuture<io::Result<()>> {
        let fail = self.fail.lock().unwrap().take();
        let gate = self.gate.lock().unwrap().take();
        let ram = Arc::clone(&self.ram);
        Box::pin(async move {
            if let Some(gate) = gate {
                let _ = gate.await;
            }
            if let Some(errno) = fail {
                return Err(io::Error::from_raw_os_error(errno));
            }
            let bytes: Vec<u8> = data.slices().concat();
            ram.write_at(offset, &bytes[..len])
        })
    }

    fn ready(&self) -> IoFuture<()> {
        let gate = self.ready_gate.lock().unwrap().take();
        Box::pin(async move {
            if let Some(gate) = gate {
                let _ = gate.await;
            }
        })
    }
}

impl Backstore for Store {
    fn block_size(&self) -> u32 {
        self.ram.block_size()
    }
    fn block_count(&self) -> u64 {
        self.ram.block_count()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let gate = self.read_gate.lock().unwrap().take();
        if let Some((started, release)) = gate {
            started.send(()).unwrap();
            release.recv().unwrap();
        }
        self.ram.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.ram.write_at(offset, buf)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        self.ram.unmap(offset, len)
    }
    fn unique_id(&self) -> u64 {
        7
    }
    fn async_io(&self) -> Option<Arc<dyn AsyncIo>> {
        Some(Arc::clone(&self.io) as Arc<dyn AsyncIo>)
    }
}

fn setup() -> (Arc<ScsiTarget>, Arc<Io>) {
    let (t, io, _) = setup_with_store();
    (t, io)
}

fn setup_with_store() -> (Arc<ScsiTarget>, Arc<Io>, Arc<Store>) {
    let ram = Arc::new(RamBackstore::new(1 << 20, 512, 1).unwrap());
    let io = Arc::new(Io {
        ram: Arc::clone(&ram),
        gate: Mutex::new(None),
        fail: Mutex::new(None),
        ready_gate: Mutex::new(None),
    });
    let store = Arc::new(Store {
        ram,
        io: Arc::clone(&io),
        read_gate: Mutex::new(None),
    });
    (Arc::new(target_over(store.clone())), io, store)
}

fn plan(t: &ScsiTarget, n: &iscsi_scsi::Nexus, cdb: &[u8], out: &[u8]) -> Planned {
    t.plan_io(n, encode_lun(0), cdb, DataOut::Flat(out))
}

fn planned(p: Planned) -> PlannedIo {
    match p {
        Planned::Io(io) => io,
        Planned::Done(o) => panic!("expected a transfer, got {o:?}"),
        Planned::Synchronous => panic!("expected a transfer, got Synchronous"),
    }
}

fn done(p: Planned) -> CommandOutcome {
    match p {
        Planned::Done(o) => o,
        Planned::Io(io) => panic!("expected an answer, got a transfer {:?}", io.transfer),
        Planned::Synchronous => panic!("expected an answer, got Synchronous"),
    }
}

#[tokio::test]
async fn a_read_and_a_write_are_planned_and_run_by_the_caller() {
    let (t, _) = setup();
    let n = nexus(1);
    let data = pattern(3, 4096);
    let w = planned(plan(&t, &n, &cdb16(0x8A, 0x08, 10, 8), &data));
    assert_eq!(
        w.transfer,
        Transfer {
            offset: 5120,
            len: 4096,
            write: true,
            through: true,
        },
        "WRITE(16) with FUA"
    );
    assert_eq!(w.write(Box::new(data.clone())).await, CommandOutcome::GOOD);
    let r = planned(plan(&t, &n, &read16(10, 8), &[]));
    assert_eq!(
        (r.transfer.offset, r.transfer.len, r.transfer.write),
        (5120, 4096, false)
    );
    let (back, outcome) = r.read(vec![0xEE; 3]).await;
    assert_eq!(outcome, CommandOutcome::GOOD);
    assert_eq!(back, data);
    // The synchronous path sees the same medium.
    assert_eq!(good(&t, &n, &read16(10, 8), &[]), data);
}

#[test]
fn refusals_are_answered_without_a_transfer() {
    let (t, _) = setup();
    let (a, b) = (nexus(1), nexus(2));
    // Out of range, a transfer of nothing, data shorter than the CDB says.
    let o = done(plan(&t, &a, &read16(2048, 1), &[]));
    assert_eq!(o.status, status::CHECK_CONDITION);
    assert_eq!(done(plan(&t, &a, &read16(0, 0), &[])), CommandOutcome::GOOD);
    let o = done(plan(&t, &a, &write16(0, 8), &[0; 512]));
    assert_eq!(o.status, status::CHECK_CONDITION);
    // Reserved (SPC-2) by another nexus: RESERVATION CONFLICT, as execute.
    good(&t, &a, &[0x16, 0, 0, 0, 0, 0], &[]);
    let o = done(plan(&t, &b, &write16(0, 1), &[0; 512]));
    assert_eq!(o.status, status::RESERVATION_CONFLICT);
    assert!(matches!(
        plan(&t, &a, &write16(0, 1), &[0; 512]),
        Planned::Io(_)
    ));
}

#[tokio::test]
async fn an_io_error_becomes_the_sense_its_errno_means() {
    let (t, io) = setup();
    let n = nexus(1);
    *io.fail.lock().unwrap() = Some(110); // ETIMEDOUT
    let (data, o) = planned(plan(&t, &n, &read16(0, 1), &[]))
        .read(Vec::new())
        .await;
    assert!(data.is_empty());
    assert_eq!(o.status, status::CHECK_CONDITION);
    assert_eq!(o.sense, Some(Sense::LU_COMMUNICATION_TIMEOUT));
    *io.fail.lock().unwrap() = Some(108); // ESHUTDOWN: blocklisted
    let o = planned(plan(&t, &n, &write16(0, 1), &[1; 512]))
        .write(Box::new(vec![1u8; 512]))
        .await;
    assert_eq!(o.sense, Some(Sense::LU_COMMUNICATION_FAILURE));
}

/// EAGAIN (a fenced RBD gateway rejoining): "again soon", BUSY status with
/// no sense, which initiators send again; read or write, nothing read.
#[tokio::test]
async fn a_store_that_says_again_soon_gets_busy() {
    let (t, io) = setup();
    let n = nexus(1);
    good(&t, &n, &write16(0, 1), &[5; 512]);
    *io.fail.lock().unwrap() = Some(11); // EAGAIN
    let o = planned(plan(&t, &n, &write16(0, 1), &[6; 512]))
        .write(Box::new(vec![6u8; 512]))
        .await;
    assert_eq!(o, CommandOutcome::BUSY);
    assert!(o.sense_bytes().is_empty());
    *io.fail.lock().unwrap() = Some(11);
    let (data, o) = planned(plan(&t, &n, &read16(0, 1), &[]))
        .read(Vec::new())
        .await;
    assert!(data.is_empty());
    assert_eq!(o.status, status::BUSY);
    // Sent again, it runs.
    let (data, o) = planned(plan(&t, &n, &read16(0, 1), &[]))
        .read(Vec::new())
        .await;
    assert!(o.is_good());
    assert_eq!(data, vec![5u8; 512]);
}

/// COMPARE AND WRITE of LBA 0 (`compare` then `write`, one block each),
/// run on the blocking pool: it may wait for the asynchronous writes in
/// flight.
fn compare_and_write_on_the_pool(
    t: &Arc<ScsiTarget>,
    n: &iscsi_scsi::Nexus,
    compare: &[u8],
    write: &[u8],
) -> tokio::task::JoinHandle<CommandOutcome> {
    let (t, n) = (Arc::clone(t), n.clone());
    let out = [compare, write].concat();
    tokio::task::spawn_blocking(move || run(&t, &n, &caw(0, 1), &out).0)
}

/// A write the store asks for again waits for the store's word
/// (`AsyncIo::ready`: a fenced gateway's rejoin) before its BUSY goes out,
/// holding nothing of the LU: what the store waits for may itself wait for
/// the LU's writes in flight (a rejoin drains them), so a COMPARE AND WRITE,
/// which does, runs meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_write_waits_for_the_store_holding_nothing_of_the_lu() {
    let (t, io) = setup();
    let n = nexus(1);
    let old = pattern(1, 512);
    good(&t, &n, &write16(0, 1), &old);
    let (open, gate) = oneshot::channel();
    *io.ready_gate.lock().unwrap() = Some(gate);
    *io.fail.lock().unwrap() = Some(11); // EAGAIN
    let write = planned(plan(&t, &n, &write16(0, 1), &pattern(2, 512)));
    let writing = tokio::spawn(write.write(Box::new(pattern(2, 512))));
    let caw = compare_and_write_on_the_pool(&t, &n, &old, &pattern(3, 512));
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(10), caw)
            .await
            .expect("COMPARE AND WRITE waited for a write that only waits for the store")
            .unwrap(),
        CommandOutcome::GOOD
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !writing.is_finished(),
        "BUSY went out before the store said so"
    );
    open.send(()).unwrap();
    assert_eq!(writing.await.unwrap(), CommandOutcome::BUSY);
    assert_eq!(good(&t, &n, &read16(0, 1), &[]), pattern(3, 512));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_write_waits_for_an_asynchronous_write_in_flight() {
    let (t, io) = setup();
    let n = nexus(1);
    let old = pattern(1, 512);
    good(&t, &n, &write16(0, 1), &old);
    // A write planned and started, held back by the store.
    let (open, gate) = oneshot::channel();
    *io.gate.lock().unwrap() = Some(gate);
    let new = pattern(2, 512);
    let write = planned(plan(&t, &n, &write16(0, 1), &new));
    let writing = tokio::spawn(write.write(Box::new(new.clone())));
    // COMPARE AND WRITE of the old contents: atomic with respect to every
    // other write, so it must wait for the one in flight to end.
    let caw = compare_and_write_on_the_pool(&t, &n, &old, &pattern(3, 512));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !caw.is_finished(),
        "COMPARE AND WRITE ran beside a write in flight"
    );
    open.send(()).unwrap();
    assert_eq!(writing.await.unwrap(), CommandOutcome::GOOD);
    // The write landed first: the compare now fails (MISCOMPARE).
    let o = caw.await.unwrap();
    assert_eq!(o.status, status::CHECK_CONDITION);
    assert_eq!(good(&t, &n, &read16(0, 1), &[]), new);
}

#[test]
fn a_write_that_finds_an_exclusive_writer_is_sent_to_the_synchronous_path() {
    // The planner runs on the transport's async task: it must not wait for
    // a COMPARE AND WRITE (or a SANITIZE) holding the LU exclusively.
    let (t, _, store) = setup_with_store();
    let n = nexus(1);
    let old = pattern(1, 512);
    good(&t, &n, &write16(0, 1), &old);
    let (started, entered) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel();
    *store.read_gate.lock().unwrap() = Some((started, released));
    let caw = {
        let t = Arc::clone(&t);
        let n = n.clone();
        let mut out = old.clone();
        out.extend_from_slice(&pattern(3, 512));
        std::thread::spawn(move || run(&t, &n, &caw(0, 1), &out).0)
    };
    // COMPARE AND WRITE holds the LU and waits inside its read.
    entered.recv_timeout(Duration::from_secs(10)).unwrap();
    let during = plan(&t, &n, &write16(8, 1), &pattern(4, 512));
    assert!(
        matches!(during, Planned::Synchronous),
        "not sent to the synchronous path"
    );
    // Reads need no write access: still planned.
    assert!(matches!(plan_read(&t, &n), Planned::Io(_)));
    release.send(()).unwrap();
    assert_eq!(caw.join().unwrap(), CommandOutcome::GOOD);
    // Once it is done, writes are planned again.
    assert!(matches!(
        plan(&t, &n, &write16(8, 1), &pattern(4, 512)),
        Planned::Io(_)
    ));
}

fn plan_read(t: &ScsiTarget, n: &iscsi_scsi::Nexus) -> Planned {
    plan(t, n, &read16(8, 1), &[])
}
