//! A session lost while one of its writes is at the store: the next
//! session of the same I_T nexus runs only once that write is over, so it
//! never lands over what the new session wrote (`serve.rs`,
//! `quiesce_nexus`).

use crate::common::*;

/// A RAM LUN whose writes of blocks starting with [`STALE`] take
/// [`STALE_DELAY`] at the store: a write the old session left running.
#[derive(Debug)]
struct SlowStaleWrites(RamBackstore);

const STALE: u8 = 0xEE;
const STALE_DELAY: Duration = Duration::from_millis(700);

impl Backstore for SlowStaleWrites {
    fn block_size(&self) -> u32 {
        self.0.block_size()
    }
    fn block_count(&self) -> u64 {
        self.0.block_count()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.0.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        if buf.first() == Some(&STALE) {
            std::thread::sleep(STALE_DELAY);
        }
        self.0.write_at(offset, buf)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.0.flush()
    }
    fn unmap(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.0.unmap(offset, len)
    }
    fn unique_id(&self) -> u64 {
        self.0.unique_id()
    }
}

/// The initiator loses its connection while a write is at the store, logs
/// in again (same ISID: the new session replaces the old, RFC 7143 6.3.5)
/// and writes the same blocks again, as an initiator retrying what was
/// never answered does. The old write must not land over the new one: the
/// new session runs only once the old one's tasks are over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_left_at_the_store_by_a_lost_session_never_lands_over_the_next_sessions() {
    let store = Arc::new(SlowStaleWrites(
        RamBackstore::new(16 << 20, BLOCK as u32, 7).expect("a RAM LUN"),
    ));
    let target = Target::start(|config| {
        config.targets[0].luns = iscsi_target::numbered(vec![store as Arc<dyn Backstore>]);
    })
    .await;
    let mut old = Client::login(target.address, offers(), 0).await;
    let stale = vec![STALE; 4 * BLOCK];
    let itt = old.itt();
    old.write10(itt, 40, 4, &stale).await;
    // The write is at the store (the LUN's writes go to the blocking pool);
    // its connection goes.
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(old);
    let mut again = Client::login(target.address, offers(), 0).await;
    let fresh = pattern(4 * BLOCK, 5);
    assert_eq!(again.write_blocks(40, &fresh).await, 0);
    tokio::time::sleep(STALE_DELAY).await;
    let read = again.read_blocks(40, 4).await;
    assert!(
        read == fresh,
        "the old session's write landed over the new session's (the blocks read {:02x?}...)",
        &read[..8]
    );
    target.stop().await;
}

/// An initiator that stops reading but keeps its socket open (hung, or a
/// socket that lingers after its connection was given up) while the
/// target sends it Data-In: once the socket buffers are full, the target's
/// send waits for a reader that never comes. A new login of the same I_T
/// nexus (reinstatement) must still go through at once, not after
/// `QUIESCE_BOUND`: the old session closes before its tasks are waited
/// for, and a connection that closes severs its socket, which fails the
/// send that was waiting, so the read's task ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reinstatement_is_not_held_by_a_send_to_an_initiator_that_stopped_reading() {
    let target = Target::start(|_| {}).await;
    let mut old = Client::login(target.address, offers(), 0).await;
    // 30 MiB of Data-In asked for, far more than two sockets buffer.
    for i in 0..30u32 {
        let itt = old.itt();
        old.read10(itt, (i % 16) * 2048, 2048).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = tokio::time::timeout(
        Duration::from_secs(5),
        Client::login(target.address, offers(), 0),
    )
    .await;
    assert!(
        again.is_ok(),
        "the reinstating login waited for the old session"
    );
    drop(old);
    target.stop().await;
}
