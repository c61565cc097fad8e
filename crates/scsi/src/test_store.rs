//! A store for the crate's own unit tests: bytes in one vector, nothing
//! else. The real stores (`iscsi-stores`, `iscsi-ceph`) depend on this
//! crate, so its unit tests cannot use them; the integration tests in
//! `tests/` do.

use std::io;
use std::sync::{Mutex, PoisonError};

use crate::backstore::{Backstore, check_range};

/// Every block held in memory, zero until written.
#[derive(Debug)]
pub(crate) struct TestStore {
    bytes: Mutex<Vec<u8>>,
    block_size: u32,
    unique_id: u64,
}

impl TestStore {
    /// `size` bytes of `block_size`-byte blocks, named `unique_id`.
    pub(crate) fn new(size: u64, block_size: u32, unique_id: u64) -> Self {
        let len = usize::try_from(size).expect("a test store fits in memory");
        Self {
            bytes: Mutex::new(vec![0; len]),
            block_size,
            unique_id,
        }
    }

    fn size(&self) -> u64 {
        self.bytes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len() as u64
    }
}

impl Backstore for TestStore {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn block_count(&self) -> u64 {
        self.size() / u64::from(self.block_size)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(offset, buf.len() as u64, self.size())?;
        let bytes = self.bytes.lock().unwrap_or_else(PoisonError::into_inner);
        let at = offset as usize;
        buf.copy_from_slice(&bytes[at..at + buf.len()]);
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        check_range(offset, buf.len() as u64, self.size())?;
        let mut bytes = self.bytes.lock().unwrap_or_else(PoisonError::into_inner);
        let at = offset as usize;
        bytes[at..at + buf.len()].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(|_| crate::backstore::out_of_range())?;
        self.write_at(offset, &vec![0; len])
    }

    fn unique_id(&self) -> u64 {
        self.unique_id
    }
}

#[test]
fn reads_what_was_written_and_refuses_past_the_end() {
    let s = TestStore::new(4096, 512, 1);
    s.write_at(512, &[7; 512]).unwrap();
    let mut back = [0u8; 1024];
    s.read_at(0, &mut back).unwrap();
    assert!(back[..512].iter().all(|&b| b == 0) && back[512..].iter().all(|&b| b == 7));
    assert!(s.read_at(4000, &mut back).is_err());
    assert!(s.write_at(u64::MAX, &[1]).is_err());
    s.unmap(512, 512).unwrap();
    s.read_at(512, &mut back[..512]).unwrap();
    assert!(back[..512].iter().all(|&b| b == 0));
    assert_eq!(s.block_count(), 8);
}
