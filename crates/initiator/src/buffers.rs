//! The session's pool of read buffers: the buffers that pooled reads
//! ([`crate::Command::read_pooled`]) get when their first Data-In arrives,
//! taken back through [`crate::Session::recycle`].
//!
//! A buffer attached late and reused last-in first-out stays hot in cache
//! when the target sends one command's Data-In at a time (ours does): the
//! same few buffers take turns however deep the queue is, and the kernel's
//! copy out of the socket lands in cache instead of memory. With a buffer
//! per command in flight, 16 reads of 1 MiB cycle through 16 MiB, and that
//! copy ran at a third of the speed. A target that interleaves its
//! commands' Data-In (tgtd does) keeps one buffer per command busy all the
//! same; only a discarded read, which goes through one scratch buffer, is
//! immune. A deep queue of large reads also holds memory only for the reads
//! whose data is arriving.

use iscsi_datamover::BufferPool;

/// Buffers kept for reuse, LIFO.
#[derive(Debug)]
pub(crate) struct ReadBuffers {
    pool: BufferPool,
}

impl Default for ReadBuffers {
    fn default() -> Self {
        ReadBuffers {
            pool: BufferPool::new(Self::KEEP, Self::LARGEST_KEPT),
        }
    }
}

impl ReadBuffers {
    /// Buffers kept, at most.
    const KEEP: usize = 64;
    /// A larger buffer is freed rather than kept.
    const LARGEST_KEPT: usize = 16 << 20;

    /// A buffer of `length` bytes. Without `zeroed` its bytes are those of
    /// an earlier read of this session (to be overwritten by the Data-In
    /// arriving in order); with it, zeros (out-of-order data may leave
    /// holes).
    pub(crate) fn take(&self, length: usize, zeroed: bool) -> Vec<u8> {
        let mut buffer = self.pool.take();
        if zeroed {
            buffer.clear();
        }
        // Shrinking truncates; only growth is zeroed.
        buffer.resize(length, 0);
        buffer
    }

    /// Keeps `buffer` for a later read.
    pub(crate) fn give(&self, buffer: Vec<u8>) {
        self.pool.give(buffer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_last_in_first_out_and_zeroes_on_request() {
        let pool = ReadBuffers::default();
        assert_eq!(pool.take(4, false), [0; 4], "a fresh buffer is zeros");
        pool.give(vec![7; 8]);
        let mut reused = pool.take(8, false);
        assert_eq!(reused, [7; 8], "a reused buffer keeps its bytes");
        reused[0] = 9;
        let address = reused.as_ptr();
        pool.give(reused);
        let zeroed = pool.take(6, true);
        assert_eq!(zeroed.as_ptr(), address, "the same allocation");
        assert_eq!(zeroed, [0; 6]);
    }

    #[test]
    fn keeps_a_bounded_number_of_bounded_buffers() {
        let pool = ReadBuffers::default();
        let kept = |pool: &ReadBuffers| {
            std::iter::from_fn(|| Some(pool.pool.take()))
                .take_while(|buffer| buffer.capacity() > 0)
                .count()
        };
        pool.give(Vec::new());
        pool.give(Vec::with_capacity(ReadBuffers::LARGEST_KEPT + 1));
        assert_eq!(kept(&pool), 0);
        for _ in 0..ReadBuffers::KEEP + 5 {
            pool.give(vec![1; 16]);
        }
        assert_eq!(kept(&pool), ReadBuffers::KEEP);
    }
}
