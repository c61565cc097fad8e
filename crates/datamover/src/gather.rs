//! [`Gather`]: data in shared pieces, in order (a target's READ data as the
//! backstore lent it), handed to `Put_Data` without being joined: over TCP
//! the pieces go out in one vectored write, over iSER as RDMA Writes.

use bytes::Bytes;

/// Bytes in pieces, in order, cheap to clone and to slice.
#[derive(Clone, Debug, Default)]
pub struct Gather {
    pieces: Vec<Bytes>,
    len: usize,
}

impl Gather {
    /// The concatenation of `pieces` (empty ones dropped).
    pub fn from_pieces(pieces: Vec<Bytes>) -> Self {
        let mut pieces = pieces;
        pieces.retain(|p| !p.is_empty());
        let len = pieces.iter().map(Bytes::len).sum();
        Gather { pieces, len }
    }

    /// Total length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pieces, in order, none empty.
    pub fn pieces(&self) -> &[Bytes] {
        &self.pieces
    }

    /// Bytes `range` as a gather of their own (no byte copied).
    ///
    /// # Panics
    /// If `range` is not within `0..self.len()` or runs backwards, as
    /// slicing does.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Gather {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "range {range:?} out of 0..{}",
            self.len
        );
        let mut pieces = Vec::new();
        let mut at = 0;
        for piece in &self.pieces {
            let (start, end) = (at, at + piece.len());
            at = end;
            if end <= range.start {
                continue;
            }
            if start >= range.end {
                break;
            }
            let from = range.start.max(start) - start;
            let to = range.end.min(end) - start;
            pieces.push(piece.slice(from..to));
        }
        Gather {
            pieces,
            len: range.len(),
        }
    }

    /// The bytes as one piece: free when there is at most one, else a copy.
    pub fn joined(&self) -> Bytes {
        match self.pieces.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            many => many.concat().into(),
        }
    }
}

impl From<Bytes> for Gather {
    fn from(bytes: Bytes) -> Self {
        Gather::from_pieces(vec![bytes])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cross_pieces_without_copying() {
        let a = Bytes::from_static(b"abcd");
        let g = Gather::from_pieces(vec![a.clone(), Bytes::new(), Bytes::from_static(b"efghij")]);
        assert_eq!(g.len(), 10);
        assert_eq!(g.pieces().len(), 2, "the empty piece is dropped");
        let s = g.slice(2..7);
        assert_eq!(s.len(), 5);
        assert_eq!(&s.joined()[..], b"cdefg");
        assert_eq!(s.pieces()[0].as_ptr(), a[2..].as_ptr(), "not copied");
        assert!(g.slice(4..4).is_empty());
        assert_eq!(&g.slice(4..10).joined()[..], b"efghij");
        assert_eq!(g.slice(4..10).pieces().len(), 1);
        assert_eq!(&Gather::from(Bytes::from_static(b"x")).joined()[..], b"x");
    }

    #[test]
    #[should_panic(expected = "out of")]
    fn slicing_past_the_end_panics() {
        let _ = Gather::from(Bytes::from_static(b"abc")).slice(1..4);
    }
}
