//! The oracle's model of the LUN: for every block, the write last
//! acknowledged there, and the writes that may or may not have landed (an
//! aborted write: its ABORT TASK answered before its status). Every block
//! a write puts down names the write and the block, so a read says which
//! write it sees.

/// A write's number (0: the LUN's initial zeros).
pub type WriteId = u64;

/// What each block may hold.
#[derive(Clone, Debug)]
pub struct Model {
    acked: Vec<WriteId>,
    maybe: Vec<Vec<WriteId>>,
    block: usize,
}

/// The bytes write `id` puts in `block`: its number and the block's,
/// then a pattern of both (zeros for the initial contents).
pub fn pattern(id: WriteId, block: usize, len: usize) -> Vec<u8> {
    if id == 0 {
        return vec![0; len];
    }
    let mut bytes = Vec::with_capacity(len);
    bytes.extend_from_slice(&id.to_le_bytes());
    bytes.extend_from_slice(&(block as u64).to_le_bytes());
    let seed = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ block as u64;
    while bytes.len() < len {
        let i = bytes.len() as u64;
        bytes.push((seed.rotate_left((i % 64) as u32) ^ i) as u8);
    }
    bytes
}

/// Which write a block's bytes are from, if they are any write's whole.
fn writer_of(bytes: &[u8], block: usize) -> Option<WriteId> {
    if bytes.iter().all(|&b| b == 0) {
        return Some(0);
    }
    let id = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    (pattern(id, block, bytes.len()) == bytes).then_some(id)
}

impl Model {
    /// A LUN of `blocks` blocks of `block` bytes, all zeros.
    pub fn new(blocks: usize, block: usize) -> Self {
        Model {
            acked: vec![0; blocks],
            maybe: vec![Vec::new(); blocks],
            block,
        }
    }

    /// The bytes write `id` sends for blocks `lba..lba + blocks`.
    pub fn payload(&self, id: WriteId, lba: usize, blocks: usize) -> Vec<u8> {
        (lba..lba + blocks)
            .flat_map(|b| pattern(id, b, self.block))
            .collect()
    }

    /// Write `id` was acknowledged: its blocks hold it from now on.
    pub fn acknowledged(&mut self, id: WriteId, lba: usize, blocks: usize) {
        for b in lba..lba + blocks {
            self.acked[b] = id;
            self.maybe[b].clear();
        }
    }

    /// Write `id` was aborted: its blocks may hold it or what they held.
    pub fn aborted(&mut self, id: WriteId, lba: usize, blocks: usize) {
        for b in lba..lba + blocks {
            self.maybe[b].push(id);
        }
    }

    /// Checks what a read of `lba..` returned; a block showing an aborted
    /// write settles that it landed.
    pub fn read(&mut self, lba: usize, data: &[u8]) -> Result<(), String> {
        for (i, bytes) in data.chunks(self.block).enumerate() {
            let b = lba + i;
            let seen = writer_of(bytes, b);
            match seen {
                Some(id) if id == self.acked[b] => {}
                Some(id) if self.maybe[b].contains(&id) => {
                    self.acked[b] = id;
                    self.maybe[b].clear();
                }
                _ => {
                    return Err(format!(
                        "block {b} reads as {} where write {} was acknowledged (maybe {:?})",
                        seen.map_or("no write's data".to_string(), |id| format!("write {id}")),
                        self.acked[b],
                        self.maybe[b],
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_must_show_the_acknowledged_write_or_a_maybe() {
        let mut model = Model::new(4, 512);
        let first = model.payload(1, 0, 2);
        model.acknowledged(1, 0, 2);
        assert!(model.read(0, &first).is_ok());
        assert!(model.read(0, &vec![0; 1024]).is_err(), "a lost write");
        model.aborted(2, 1, 1);
        let mixed = [pattern(1, 0, 512), pattern(2, 1, 512)].concat();
        assert!(model.read(0, &mixed).is_ok(), "the aborted write landed");
        assert!(model.read(0, &first).is_err(), "and cannot un-land");
        let mut torn = pattern(1, 0, 512);
        torn[100] ^= 1;
        assert!(model.read(0, &torn).is_err());
    }
}
