//! [`Gather`]: data in shared pieces, in order (a target's READ data as the
//! backstore lent it), handed to `Put_Data` without being joined: over TCP
//! the pieces go out in one vectored write, over iSER as RDMA Writes.
//!
//! A piece may come with what knows its CRC32C (a RAM chunk remembers its
//! own): [`Gather::crc32c`] then combines the known value instead of
//! reading the bytes, which is what keeps data digests cheap once nothing
//! copies READ data any more.

use std::sync::Arc;

use bytes::Bytes;
use iscsi_crc32c::KnownCrc32c;

/// What knows the CRC32C of one whole piece.
pub type PieceCrc = Arc<dyn KnownCrc32c>;

/// Bytes in pieces, in order, cheap to clone and to slice.
#[derive(Clone, Debug, Default)]
pub struct Gather {
    pieces: Vec<Bytes>,
    /// Beside each piece, what knows its CRC32C; empty when nothing is
    /// known of any piece (the common case costs no allocation).
    crcs: Vec<Option<PieceCrc>>,
    len: usize,
}

impl Gather {
    /// The concatenation of `pieces` (empty ones dropped).
    pub fn from_pieces(pieces: Vec<Bytes>) -> Self {
        let mut pieces = pieces;
        pieces.retain(|p| !p.is_empty());
        let len = pieces.iter().map(Bytes::len).sum();
        Gather {
            pieces,
            crcs: Vec::new(),
            len,
        }
    }

    /// The concatenation of `pieces`, each with what knows the CRC32C of
    /// exactly that piece, if anything does (empty pieces dropped).
    pub fn from_pieces_with_crcs(
        pieces: impl IntoIterator<Item = (Bytes, Option<PieceCrc>)>,
    ) -> Self {
        let (pieces, crcs): (Vec<Bytes>, Vec<Option<PieceCrc>>) =
            pieces.into_iter().filter(|(p, _)| !p.is_empty()).unzip();
        let len = pieces.iter().map(Bytes::len).sum();
        let crcs = if crcs.iter().any(Option::is_some) {
            crcs
        } else {
            Vec::new()
        };
        Gather { pieces, crcs, len }
    }

    /// The CRC32C of all the bytes: pieces whose CRC is known are combined
    /// from it (two GF(2) multiplications for a power-of-two length), the
    /// others are read.
    pub fn crc32c(&self) -> u32 {
        self.pieces.iter().enumerate().fold(0, |crc, (i, piece)| {
            match self.crcs.get(i).and_then(Option::as_ref) {
                Some(known) => {
                    iscsi_crc32c::crc32c_combine(crc, known.crc32c(), piece.len() as u64)
                }
                None => iscsi_crc32c::crc32c_append(crc, piece),
            }
        })
    }

    /// Whether the CRC32C of some piece is known without reading it.
    pub fn has_known_crcs(&self) -> bool {
        !self.crcs.is_empty()
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
        let mut crcs = Vec::new();
        let mut any_crc = false;
        let mut at = 0;
        for (i, piece) in self.pieces.iter().enumerate() {
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
            // A known CRC is that of the whole piece: a cut piece has none.
            let whole = from == 0 && to == piece.len();
            let crc = self
                .crcs
                .get(i)
                .and_then(Option::as_ref)
                .filter(|_| whole)
                .cloned();
            any_crc |= crc.is_some();
            crcs.push(crc);
        }
        Gather {
            pieces,
            crcs: if any_crc { crcs } else { Vec::new() },
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

/// What the target keeps of a command's Data-In for a SNACK: the very
/// pieces it sent, shared.
impl iscsi_proto::transfer::Payload for Gather {
    fn len(&self) -> usize {
        Gather::len(self)
    }

    fn slice(&self, range: std::ops::Range<usize>) -> Self {
        Gather::slice(self, range)
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

    /// A piece's CRC32C that can be seen to have been used.
    #[derive(Debug)]
    struct Counted(u32, std::sync::atomic::AtomicUsize);

    impl KnownCrc32c for Counted {
        fn crc32c(&self) -> u32 {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.0
        }
    }

    #[test]
    fn known_crcs_are_combined_and_dropped_for_cut_pieces() {
        let a = Bytes::from((0..4096u32).map(|i| i as u8).collect::<Vec<u8>>());
        let b = Bytes::from((0..8192u32).map(|i| (i * 7) as u8).collect::<Vec<u8>>());
        let c = Bytes::from_static(b"tail bytes");
        let known_a = Arc::new(Counted(iscsi_crc32c::crc32c(&a), Default::default()));
        let known_b = Arc::new(Counted(iscsi_crc32c::crc32c(&b), Default::default()));
        let g = Gather::from_pieces_with_crcs([
            (a.clone(), Some(known_a.clone() as PieceCrc)),
            (Bytes::new(), None),
            (b.clone(), Some(known_b.clone() as PieceCrc)),
            (c.clone(), None),
        ]);
        assert!(g.has_known_crcs());
        assert_eq!(g.crc32c(), iscsi_crc32c::crc32c(&g.joined()));
        assert_eq!(known_a.1.load(std::sync::atomic::Ordering::Relaxed), 1);
        // Every cut: the CRC still right, a known one used only for a
        // piece kept whole.
        for start in [0, 1, 4095, 4096, 4097, 12288] {
            for end in [start, 4096, 12288, 12290, g.len()] {
                if end < start {
                    continue;
                }
                let s = g.slice(start..end);
                assert_eq!(
                    s.crc32c(),
                    iscsi_crc32c::crc32c(&s.joined()),
                    "{start}..{end}"
                );
            }
        }
        let before = known_b.1.load(std::sync::atomic::Ordering::Relaxed);
        let _ = g.slice(4096..12287).crc32c();
        assert_eq!(
            known_b.1.load(std::sync::atomic::Ordering::Relaxed),
            before,
            "cut: not used"
        );
        assert!(!g.slice(4097..12290).has_known_crcs());
        assert!(!Gather::from_pieces_with_crcs([(c, None)]).has_known_crcs());
    }

    #[test]
    #[should_panic(expected = "out of")]
    fn slicing_past_the_end_panics() {
        let _ = Gather::from(Bytes::from_static(b"abc")).slice(1..4);
    }
}
