//! [`BufferPool`]: data buffers reused from command to command, last in
//! first out, by the target (Data-Out gathered, Data-In read) and by the
//! initiator (pooled and discarded reads). Reuse avoids an allocation per
//! command; LIFO order hands back the buffer most likely still in cache.
//! A buffer comes back holding whatever it held: callers that need zeros
//! clear it, callers that overwrite every byte do not pay for zeroing.

use std::sync::{Mutex, PoisonError};

/// A bounded LIFO stack of byte buffers.
#[derive(Debug)]
pub struct BufferPool {
    free: Mutex<Free>,
    /// Buffers kept, at most.
    keep: usize,
    /// A buffer with a larger capacity is freed rather than kept.
    largest: usize,
    /// The capacities of the buffers kept add up to this, at most.
    bytes: usize,
}

/// The buffers kept, and the sum of their capacities.
#[derive(Debug, Default)]
struct Free {
    buffers: Vec<Vec<u8>>,
    bytes: usize,
}

impl Free {
    fn remove(&mut self, i: usize) -> Vec<u8> {
        let buffer = self.buffers.remove(i);
        self.bytes -= buffer.capacity();
        buffer
    }

    fn pop(&mut self) -> Option<Vec<u8>> {
        let buffer = self.buffers.pop()?;
        self.bytes -= buffer.capacity();
        Some(buffer)
    }
}

impl BufferPool {
    /// A pool keeping at most `keep` buffers of at most `largest` bytes of
    /// capacity each.
    pub fn new(keep: usize, largest: usize) -> Self {
        Self::bounded(keep, largest, usize::MAX)
    }

    /// [`BufferPool::new`], keeping no more than `bytes` of capacity in all
    /// (many small buffers, or a few large ones).
    pub fn bounded(keep: usize, largest: usize, bytes: usize) -> Self {
        BufferPool {
            free: Mutex::new(Free::default()),
            keep,
            largest,
            bytes,
        }
    }

    /// The buffer given back last, with its old contents, or a new empty one.
    pub fn take(&self) -> Vec<u8> {
        self.free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
            .unwrap_or_default()
    }

    /// A buffer holding at least `len` initialised bytes if one is kept (the
    /// one holding fewest, the latest given among equals), else
    /// [`BufferPool::take`]'s. Why: a `Vec` cannot grow its length without
    /// writing the new bytes, so a 1 MiB write given a buffer a 4 KiB
    /// command shortened (or a command cleared) zeroes 1 MiB first; picked
    /// by length, a write reuses a buffer a write gave back (the memset
    /// was 13% of the target's CPU on 1 MiB writes).
    pub fn take_filled(&self, len: usize) -> Vec<u8> {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        let best = free
            .buffers
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, b)| b.len() >= len)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i);
        match best {
            Some(i) => free.remove(i),
            None => free.pop().unwrap_or_default(),
        }
    }

    /// Keeps `buffer` for a later [`BufferPool::take`]. An empty allocation
    /// is not kept: it would only displace a real buffer.
    pub fn give(&self, buffer: Vec<u8>) {
        if buffer.capacity() == 0 || buffer.capacity() > self.largest {
            return;
        }
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        if free.buffers.len() < self.keep && free.bytes + buffer.capacity() <= self.bytes {
            free.bytes += buffer.capacity();
            free.buffers.push(buffer);
        }
    }
}

/// A buffer of a [`BufferPool`] that goes back to the pool when the last
/// `Bytes` made from it is dropped ([`PooledBuffer::into_bytes`]): data
/// handed to a datamover that sends it later (iSER's RDMA Writes) comes
/// home by itself once it is on the wire.
pub struct PooledBuffer {
    buffer: Vec<u8>,
    pool: std::sync::Arc<BufferPool>,
}

impl PooledBuffer {
    /// Wraps `buffer`, which returns to `pool` at the end.
    pub fn new(buffer: Vec<u8>, pool: std::sync::Arc<BufferPool>) -> Self {
        PooledBuffer { buffer, pool }
    }

    /// The buffer as `Bytes` (no copy); cheap to clone and slice.
    pub fn into_bytes(self) -> bytes::Bytes {
        bytes::Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for PooledBuffer {
    fn as_ref(&self) -> &[u8] {
        &self.buffer
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        self.pool.give(std::mem::take(&mut self.buffer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_in_first_out_with_contents() {
        let pool = BufferPool::new(4, 1024);
        assert!(pool.take().is_empty(), "an empty pool makes a new buffer");
        pool.give(vec![1; 8]);
        pool.give(vec![2; 8]);
        assert_eq!(pool.take(), [2; 8]);
        assert_eq!(pool.take(), [1; 8]);
    }

    #[test]
    fn take_filled_prefers_the_shortest_buffer_long_enough() {
        let pool = BufferPool::new(8, 1 << 20);
        pool.give(vec![1; 4096]);
        pool.give(vec![2; 65536]);
        pool.give(vec![3; 8192]);
        pool.give(Vec::with_capacity(65536).into_iter().chain([4u8]).collect());
        assert_eq!(
            pool.take_filled(5000),
            [3; 8192],
            "the shortest long enough"
        );
        assert_eq!(pool.take_filled(65536), [2; 65536]);
        assert_eq!(
            pool.take_filled(100_000),
            [4],
            "none long enough: the latest"
        );
        assert_eq!(pool.take_filled(1), [1; 4096]);
        assert!(
            pool.take_filled(1).is_empty(),
            "an empty pool makes a new buffer"
        );
        // Among equals, the latest given (still warm in cache).
        let (a, b) = (vec![7; 16], vec![8; 16]);
        pool.give(a);
        pool.give(b);
        assert_eq!(pool.take_filled(16), [8; 16]);
    }

    #[test]
    fn keeps_a_bounded_number_of_bytes() {
        let pool = BufferPool::bounded(100, 1024, 3000);
        for _ in 0..5 {
            pool.give(vec![1; 1000]);
        }
        assert_eq!(pool.take().len(), 1000);
        pool.give(vec![2; 1000]);
        pool.give(vec![3; 1000]);
        let kept = std::iter::from_fn(|| Some(pool.take()))
            .take_while(|b| !b.is_empty())
            .count();
        assert_eq!(kept, 3, "3000 bytes of buffers at most");
    }

    #[test]
    fn keeps_a_bounded_number_of_bounded_buffers() {
        let pool = BufferPool::new(3, 64);
        pool.give(Vec::new());
        pool.give(Vec::with_capacity(65));
        assert!(pool.take().capacity() == 0, "neither was kept");
        for _ in 0..5 {
            pool.give(vec![1; 16]);
        }
        let kept = std::iter::from_fn(|| Some(pool.take()))
            .take_while(|b| !b.is_empty())
            .count();
        assert_eq!(kept, 3);
    }
}
