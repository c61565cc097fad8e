//! [`DataOut`]: a command's Data-Out as the transport received it, in one
//! buffer or in pieces of the store's own chunk size, so that a WRITE to a
//! store made of such chunks can keep the pieces instead of copying them
//! ([`crate::backstore::Backstore::write_pieces`]).

use std::borrow::Cow;

/// A command's Data-Out bytes.
#[derive(Debug)]
pub enum DataOut<'a> {
    /// One contiguous buffer.
    Flat(&'a [u8]),
    /// The first `len` bytes of the concatenation of `pieces` (each of
    /// `iscsi_stores::RAM_CHUNK_SIZE` but the last, as a transport
    /// receives large writes).
    /// A WRITE hands them to the store, which may keep some and give
    /// other buffers back in their place; every other command sees them
    /// joined into one buffer (one copy).
    Pieces {
        /// The pieces, in order.
        pieces: &'a mut [Vec<u8>],
        /// How many of their bytes are the data.
        len: usize,
    },
}

impl<'a> DataOut<'a> {
    /// No data.
    pub const NONE: DataOut<'static> = DataOut::Flat(&[]);

    /// The number of bytes.
    pub fn len(&self) -> usize {
        match self {
            DataOut::Flat(data) => data.len(),
            DataOut::Pieces { pieces, len } => {
                (*len).min(pieces.iter().map(Vec::len).sum::<usize>())
            }
        }
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first `len` bytes (all of them if there are fewer).
    pub fn shortened(self, len: usize) -> DataOut<'a> {
        match self {
            DataOut::Flat(data) => DataOut::Flat(data.get(..len).unwrap_or(data)),
            DataOut::Pieces { pieces, len: had } => DataOut::Pieces {
                pieces,
                len: had.min(len),
            },
        }
    }

    /// The bytes in one buffer: borrowed when they are in one already.
    pub fn flat(&self) -> Cow<'_, [u8]> {
        match self {
            DataOut::Flat(data) => Cow::Borrowed(data),
            DataOut::Pieces { pieces, .. } => {
                let len = self.len();
                match pieces.first() {
                    Some(first) if first.len() >= len => Cow::Borrowed(&first[..len]),
                    _ => {
                        let mut joined = Vec::with_capacity(len);
                        for piece in pieces.iter() {
                            let take = (len - joined.len()).min(piece.len());
                            joined.extend_from_slice(&piece[..take]);
                        }
                        Cow::Owned(joined)
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_join_to_their_first_len_bytes() {
        let mut pieces = vec![vec![1u8; 4], vec![2; 4], vec![3; 2]];
        let data = DataOut::Pieces {
            pieces: &mut pieces,
            len: 9,
        };
        assert_eq!(data.len(), 9);
        assert_eq!(&*data.flat(), &[1, 1, 1, 1, 2, 2, 2, 2, 3]);
        let data = data.shortened(3);
        assert_eq!(data.len(), 3);
        assert!(matches!(data.flat(), Cow::Borrowed(&[1, 1, 1])));
        let mut short = vec![vec![7u8; 2]];
        let data = DataOut::Pieces {
            pieces: &mut short,
            len: 10,
        };
        assert_eq!(data.len(), 2, "never more than the pieces hold");
        assert_eq!(DataOut::Flat(&[1, 2, 3]).shortened(9).len(), 3);
        assert!(DataOut::NONE.is_empty());
    }
}
