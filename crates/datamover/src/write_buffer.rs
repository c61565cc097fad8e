//! [`WriteBuffer`]: a target's buffer for one write's data, in one piece or
//! in pieces of the backstore's chunk size. Received in pieces, a write's
//! data lands straight in memory the store can keep as its own
//! (`iscsi_scsi::Backstore::write_pieces`): a RAM LUN then copies nothing
//! after the kernel's copy out of the socket.

use crate::buffers::BufferPool;

/// The size of the pieces a target receives writes of this size or more
/// into: a RAM store's chunk (`iscsi_stores::RAM_CHUNK_SIZE`,
/// which keeps such pieces whole). Over iSER an RDMA Read's sink is a
/// page-list region of such pieces.
pub const WRITE_PIECE: usize = 64 * 1024;

/// A write's data buffer: `len` bytes, in one buffer or in order across
/// pieces each `piece_len` long but the last.
#[derive(Debug, Default)]
pub struct WriteBuffer {
    layout: Layout,
    piece_len: usize,
    len: usize,
}

#[derive(Debug)]
enum Layout {
    Flat(Vec<u8>),
    Pieces(Vec<Vec<u8>>),
}

impl Default for Layout {
    fn default() -> Self {
        Layout::Flat(Vec::new())
    }
}

impl WriteBuffer {
    /// One buffer of `len` bytes from `pool` (old contents: see below).
    pub fn flat(pool: &BufferPool, len: usize) -> Self {
        WriteBuffer {
            layout: Layout::Flat(sized(pool, len)),
            piece_len: len,
            len,
        }
    }

    /// `len` bytes in pieces of `piece_len` (> 0) taken from `pool`, a pool
    /// of such pieces.
    ///
    /// Neither kind is zeroed: a write runs only once its tracker has seen
    /// every byte of its length arrive exactly once, so no old contents of
    /// a reused buffer can reach the store.
    pub fn in_pieces(pool: &BufferPool, len: usize, piece_len: usize) -> Self {
        let piece_len = piece_len.max(1);
        let pieces = (0..len.div_ceil(piece_len))
            .map(|i| sized(pool, piece_len.min(len - i * piece_len)))
            .collect();
        WriteBuffer {
            layout: Layout::Pieces(pieces),
            piece_len,
            len,
        }
    }

    /// The number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The length of every piece but the last (of the one buffer, when flat).
    pub fn piece_len(&self) -> usize {
        self.piece_len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether it is one buffer.
    pub fn is_flat(&self) -> bool {
        matches!(self.layout, Layout::Flat(_))
    }

    /// The pieces, in order (for the store to take: a piece may come back
    /// as another buffer of the same length, or empty); a flat buffer is
    /// one piece.
    pub fn pieces_mut(&mut self) -> &mut [Vec<u8>] {
        match &mut self.layout {
            Layout::Flat(one) => std::slice::from_mut(one),
            Layout::Pieces(pieces) => pieces,
        }
    }

    /// The buffer of a flat `WriteBuffer` (`None` in pieces).
    pub fn flat_mut(&mut self) -> Option<&mut Vec<u8>> {
        match &mut self.layout {
            Layout::Flat(one) => Some(one),
            Layout::Pieces(_) => None,
        }
    }

    /// The bytes, in order, as the slices of its pieces (one when flat).
    pub fn slices(&self) -> Vec<&[u8]> {
        let mut left = self.len;
        let all: &[Vec<u8>] = match &self.layout {
            Layout::Flat(one) => std::slice::from_ref(one),
            Layout::Pieces(pieces) => pieces,
        };
        let mut slices = Vec::with_capacity(all.len());
        for piece in all {
            let n = piece.len().min(left);
            if n == 0 {
                break;
            }
            slices.push(&piece[..n]);
            left -= n;
        }
        slices
    }

    /// Bytes `range` as the slices of the pieces they span, in order
    /// (`None` when the range is not within the buffer).
    pub fn slices_mut(&mut self, range: std::ops::Range<usize>) -> Option<Vec<&mut [u8]>> {
        if range.start > range.end || range.end > self.len {
            return None;
        }
        let piece_len = self.piece_len.max(1);
        let mut slices = Vec::with_capacity(range.len().div_ceil(piece_len) + 1);
        for (i, piece) in self.pieces_mut().iter_mut().enumerate() {
            let base = i * piece_len;
            let (start, end) = (range.start.max(base), range.end.min(base + piece.len()));
            if start < end {
                slices.push(piece.get_mut(start - base..end - base)?);
            }
        }
        Some(slices)
    }

    /// Gives every piece back: a flat buffer to `flat`, pieces to
    /// `pieces` (empty ones, which a store kept, are dropped by the pool).
    pub fn give(self, flat: &BufferPool, pieces: &BufferPool) {
        match self.layout {
            Layout::Flat(one) => flat.give(one),
            Layout::Pieces(all) => {
                for piece in all {
                    pieces.give(piece);
                }
            }
        }
    }
}

/// A buffer of exactly `len` bytes from `pool`, not zeroed where it was
/// long enough already.
fn sized(pool: &BufferPool, len: usize) -> Vec<u8> {
    let mut buffer = pool.take_filled(len);
    if buffer.len() >= len {
        buffer.truncate(len);
    } else {
        buffer.resize(len, 0);
    }
    buffer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_length_and_slices_follow_them() {
        let pool = BufferPool::new(8, 16);
        let mut b = WriteBuffer::in_pieces(&pool, 40, 16);
        assert_eq!(b.len(), 40);
        assert!(!b.is_flat() && b.flat_mut().is_none());
        let lens: Vec<usize> = b.pieces_mut().iter().map(Vec::len).collect();
        assert_eq!(lens, [16, 16, 8]);
        let slices = b.slices_mut(10..35).unwrap();
        let lens: Vec<usize> = slices.iter().map(|s| s.len()).collect();
        assert_eq!(lens, [6, 16, 3]);
        for (i, s) in b.slices_mut(0..40).unwrap().into_iter().enumerate() {
            s.fill(i as u8 + 1);
        }
        assert_eq!(b.pieces_mut()[2], vec![3u8; 8]);
        assert!(b.slices_mut(30..41).is_none());
        assert_eq!(b.slices_mut(16..16).unwrap().len(), 0);
        // Pieces go back to the pool of pieces, reused without zeroing.
        let flat = BufferPool::new(8, 1 << 20);
        b.give(&flat, &pool);
        let mut again = WriteBuffer::in_pieces(&pool, 16, 16);
        assert!(
            !again.is_flat(),
            "one piece is still pieces (a store may keep it)"
        );
        assert_eq!(
            again.pieces_mut(),
            [vec![2u8; 16]],
            "the latest whole piece given"
        );
        assert!(flat.take().is_empty(), "nothing went to the flat pool");
    }

    #[test]
    fn a_flat_buffer_is_one_piece() {
        let pool = BufferPool::new(8, 1 << 20);
        pool.give(vec![9u8; 100]);
        let mut b = WriteBuffer::flat(&pool, 50);
        assert!(b.is_flat());
        assert_eq!(b.flat_mut().unwrap(), &vec![9u8; 50]);
        assert_eq!(b.slices_mut(10..20).unwrap().len(), 1);
        let empty = WriteBuffer::flat(&pool, 0);
        assert!(empty.is_empty() && empty.is_flat());
    }
}
