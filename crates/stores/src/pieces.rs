//! What the stores that write to files and devices share: a write's pieces
//! in vectored writes, a piece of them copied out, zeros written where a
//! hole cannot be punched.

use std::io;

use iscsi_scsi::backstore::check_pieces;

/// Writes the first `len` bytes of the concatenation of `pieces` to `file`
/// at `offset` in vectored writes (`pwritev`), resumed after a short one.
pub(crate) fn write_pieces_at(
    file: &std::fs::File,
    offset: u64,
    pieces: &[Vec<u8>],
    len: usize,
) -> io::Result<()> {
    check_pieces(pieces, len)?;
    let mut slices: Vec<&[u8]> = Vec::with_capacity(pieces.len());
    let mut left = len;
    for piece in pieces {
        let n = piece.len().min(left);
        if n > 0 {
            slices.push(&piece[..n]);
        }
        left -= n;
    }
    let mut at = offset;
    let mut first = 0;
    while first < slices.len() {
        // At most IOV_MAX (1024) slices per call.
        let batch: Vec<io::IoSlice<'_>> = slices[first..]
            .iter()
            .take(1024)
            .map(|s| io::IoSlice::new(s))
            .collect();
        let mut written = match rustix::io::pwritev(file, &batch, at) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        at += written as u64;
        // Drop the slices written whole, cut the one written in part.
        while let Some(slice) = slices.get_mut(first) {
            if written < slice.len() {
                *slice = &slice[written..];
                break;
            }
            written -= slice.len();
            first += 1;
        }
    }
    Ok(())
}

/// Fills `dst` from the concatenation of `pieces`, starting at byte
/// `from` of it (the caller has checked that enough bytes are there).
pub(crate) fn copy_from_pieces(pieces: &[Vec<u8>], from: usize, dst: &mut [u8]) {
    let mut skip = from;
    let mut done = 0;
    for piece in pieces {
        if done == dst.len() {
            break;
        }
        if skip >= piece.len() {
            skip -= piece.len();
            continue;
        }
        let n = (piece.len() - skip).min(dst.len() - done);
        dst[done..done + n].copy_from_slice(&piece[skip..skip + n]);
        done += n;
        skip = 0;
    }
}

/// Zero-fill granule for stores that cannot deallocate.
const ZERO_CHUNK: usize = 1024 * 1024;

/// Writes zeros over `[offset, offset + len)` through `write`, one bounded
/// chunk at a time (the UNMAP fallback where punching holes is unsupported).
pub(crate) fn write_zeros(
    offset: u64,
    len: u64,
    mut write: impl FnMut(u64, &[u8]) -> io::Result<()>,
) -> io::Result<()> {
    let zeros = vec![0u8; usize::try_from(len).unwrap_or(ZERO_CHUNK).min(ZERO_CHUNK)];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(zeros.len() as u64);
        let chunk = zeros.get(..usize::try_from(n).unwrap_or(0)).unwrap_or(&[]);
        write(offset + done, chunk)?;
        done += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_from_pieces_starts_anywhere() {
        let pieces = vec![vec![1u8, 2, 3], vec![], vec![4, 5], vec![6, 7, 8, 9]];
        let all: Vec<u8> = (1..=9).collect();
        for from in 0..9 {
            for n in 0..=9 - from {
                let mut dst = vec![0u8; n];
                copy_from_pieces(&pieces, from, &mut dst);
                assert_eq!(dst, all[from..from + n], "from {from}, {n} bytes");
            }
        }
    }

    #[test]
    fn write_pieces_at_writes_them_in_order() {
        let file = tempfile::tempfile().unwrap();
        let pieces = vec![vec![1u8; 3000], vec![2; 5000], vec![3; 100]];
        write_pieces_at(&file, 10, &pieces, 8050).unwrap();
        let mut back = vec![0u8; 8060];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut back, 0).unwrap();
        assert!(back[..10].iter().all(|&b| b == 0));
        assert!(back[10..3010].iter().all(|&b| b == 1));
        assert!(back[3010..8010].iter().all(|&b| b == 2));
        assert!(back[8010..8060].iter().all(|&b| b == 3));
        assert_eq!(
            file.metadata().unwrap().len(),
            8060,
            "nothing past the length"
        );
        assert!(write_pieces_at(&file, 0, &pieces, 9000).is_err());
    }
}
