//! [`SlowBackstore`]: any store behind a fixed latency, as a slow or busy
//! device answers. It exists for the cases production meets and tests
//! rarely do: task management, logout and connection loss while commands
//! sit in the backstore (RFC 7143 11.6.2: an abort waits for them), and
//! timeouts. `latency=DURATION` on any LUN specification asks for it.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use iscsi_scsi::backstore::{Backstore, Lent};

/// `inner`, every read, write, flush and unmap of which first waits
/// `latency` (on the calling thread: commands to a store that
/// [may block](Backstore::may_block) run on the target's blocking pool, so
/// concurrent commands wait side by side, as on a device with a deep
/// queue).
#[derive(Debug)]
pub struct SlowBackstore {
    inner: Arc<dyn Backstore>,
    latency: Duration,
}

impl SlowBackstore {
    /// `inner` behind `latency`.
    pub fn new(inner: Arc<dyn Backstore>, latency: Duration) -> Self {
        SlowBackstore { inner, latency }
    }

    fn wait(&self) {
        std::thread::sleep(self.latency);
    }
}

impl Backstore for SlowBackstore {
    // What the store is and offers is not slowed down.
    delegate!(inner =>
        block_size, block_count, unique_id, atomic_write_max, can_block_erase, can_crypto_erase,
        crypto_erase, is_thin, unmap_granularity, allocation_status, lu_options,
        take_capacity_change, resize, shared_pr, alua, snapshots,
    );

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.wait();
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.wait();
        self.inner.write_at(offset, buf)
    }

    fn write_pieces(&self, offset: u64, pieces: &mut [Vec<u8>], len: usize) -> io::Result<()> {
        self.wait();
        self.inner.write_pieces(offset, pieces, len)
    }

    fn write_pieces_through(
        &self,
        offset: u64,
        pieces: &mut [Vec<u8>],
        len: usize,
    ) -> io::Result<()> {
        self.wait();
        self.inner.write_pieces_through(offset, pieces, len)
    }

    fn lend(&self, offset: u64, len: usize) -> Option<io::Result<Vec<Lent>>> {
        let lent = self.inner.lend(offset, len)?;
        self.wait();
        Some(lent)
    }

    fn flush(&self) -> io::Result<()> {
        self.wait();
        self.inner.flush()
    }

    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        self.wait();
        self.inner.unmap(offset, len)
    }

    fn write_through(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.wait();
        self.inner.write_through(offset, buf)
    }

    /// Always: the wait holds the calling thread.
    fn may_block(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RamBackstore;
    use std::time::Instant;

    #[test]
    fn every_access_waits_and_then_reaches_the_inner_store() {
        let ram: Arc<dyn Backstore> = Arc::new(RamBackstore::new(1 << 20, 512, 7).unwrap());
        let slow = SlowBackstore::new(ram.clone(), Duration::from_millis(20));
        assert!(slow.may_block() && !ram.may_block());
        assert_eq!(
            (slow.block_size(), slow.block_count(), slow.unique_id()),
            (512, 2048, 7)
        );
        let started = Instant::now();
        slow.write_at(4096, &[0xab; 512]).unwrap();
        let mut back = [0u8; 512];
        slow.read_at(4096, &mut back).unwrap();
        slow.flush().unwrap();
        assert!(started.elapsed() >= Duration::from_millis(60));
        assert_eq!(back, [0xab; 512]);
        let mut direct = [0u8; 512];
        ram.read_at(4096, &mut direct).unwrap();
        assert_eq!(direct, [0xab; 512]);
        assert!(slow.read_at(1 << 20, &mut back).is_err());
    }
}
