//! The RAM store's chunk table: a radix tree of 64 KiB chunk slots, one
//! lock per chunk.
//!
//! Why not one map under one lock: every read took the map's read lock and
//! every write its write lock, so with sessions on many cores each command
//! wrote the lock's cache line (reads) or waited for all the others
//! (writes). Here a command locks only the chunks it touches; the tree's
//! nodes are created once (`OnceLock`) and never removed, so finding a
//! chunk's slot is a few loads and no write. A command holds the locks of
//! all its chunks at once, taken in ascending order (no deadlock), so a
//! read or write spanning chunks is still one step against every other.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::chunk::Chunk;

/// Children per node: 2^10, so a node of slots covers 64 MiB.
const FAN_BITS: u32 = 10;
const FAN: usize = 1 << FAN_BITS;

/// The fewest levels a table has: 2^30 chunks of 64 KiB, 64 TiB.
const MIN_LEVELS: u32 = 3;

/// One chunk's slot: empty until the chunk is first written with non-zero
/// bytes.
pub(super) type Slot = RwLock<Option<Chunk>>;

enum Node {
    Slots(Box<[Slot]>),
    Inner(Box<[OnceLock<Node>]>),
}

impl Node {
    /// A node `levels` above the slots (1: a node of slots), `width` wide.
    fn new(levels: u32, width: usize) -> Self {
        if levels == 1 {
            Node::Slots((0..width).map(|_| RwLock::new(None)).collect())
        } else {
            Node::Inner((0..width).map(|_| OnceLock::new()).collect())
        }
    }
}

/// The chunk slots of one store.
pub(super) struct ChunkTable {
    /// Levels of nodes from the root to the slots (at least 1).
    levels: u32,
    root: Node,
    /// Chunks allocated: written on allocation and release only.
    allocated: AtomicU64,
}

impl std::fmt::Debug for ChunkTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkTable")
            .field("levels", &self.levels)
            .field("allocated", &self.allocated.load(Ordering::Relaxed))
            .finish()
    }
}

impl ChunkTable {
    /// A table for `chunks` chunks (at least 1), which a resize can grow
    /// to [`ChunkTable::reach`]: at least [`MIN_LEVELS`] levels, so that a
    /// store made small can grow to 64 TiB. Only the root is allocated
    /// ([`FAN`] entries: 32 KiB); one level more than the size needs costs
    /// a lookup two loads.
    pub fn new(chunks: u64) -> Self {
        let mut levels = MIN_LEVELS;
        while levels * FAN_BITS < 64 && chunks > 1u64 << (levels * FAN_BITS) {
            levels += 1;
        }
        Self {
            levels,
            root: Node::new(levels, FAN),
            allocated: AtomicU64::new(0),
        }
    }

    /// How many chunks the table can address: what the store may grow to.
    pub fn reach(&self) -> u64 {
        1u64.checked_shl(self.levels * FAN_BITS).unwrap_or(u64::MAX)
    }

    /// The first allocated chunk at or after `from`, skipping the parts of
    /// the tree never made (a shrink's scan of a 64 TiB store that holds
    /// little costs what it holds).
    pub fn next_allocated(&self, from: u64) -> Option<u64> {
        next_in(&self.root, self.levels, 0, from)
    }

    fn index_at(index: u64, level: u32) -> usize {
        ((index >> ((level - 1) * FAN_BITS)) as usize) & (FAN - 1)
    }

    /// The slot of chunk `index`, if its part of the tree exists (a chunk
    /// in a part never written is unallocated).
    pub fn find(&self, index: u64) -> Option<&Slot> {
        self.walk(index, false)
    }

    /// The slot of chunk `index`, making its part of the tree if needed.
    pub fn slot(&self, index: u64) -> Option<&Slot> {
        self.walk(index, true)
    }

    /// From the root down to chunk `index`'s slot, making the nodes on the
    /// way where `make`, else stopping at the first one missing.
    fn walk(&self, index: u64, make: bool) -> Option<&Slot> {
        let mut node = &self.root;
        let mut level = self.levels;
        loop {
            let at = Self::index_at(index, level);
            match node {
                Node::Slots(slots) => return slots.get(at),
                Node::Inner(children) => {
                    let child = children.get(at)?;
                    node = if make {
                        child.get_or_init(|| Node::new(level - 1, FAN))
                    } else {
                        child.get()?
                    };
                }
            }
            level -= 1;
        }
    }

    /// How many chunks are allocated.
    pub fn allocated(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed)
    }

    /// Records that a slot went from empty to a chunk (`true`) or back.
    pub fn count(&self, allocated: bool) {
        if allocated {
            self.allocated.fetch_add(1, Ordering::Relaxed);
        } else {
            self.allocated.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Read locks on chunks `first..=last`, in ascending order; `None` for
    /// a chunk whose part of the tree was never written (zeros).
    ///
    /// A chunk without a slot has no lock to hold, so a write could make
    /// its slot and fill it after this read passed it by, while the read
    /// still waits for a later chunk's lock that the write holds: the read
    /// would see the old first part and the new second part of one write
    /// (torn, which WRITE ATOMIC and the one-step promise forbid). So once
    /// every lock is held, the chunks found missing are looked up again:
    /// parts of the tree are never removed, so if each is still missing no
    /// write has touched them up to now, and what is held is one moment's
    /// contents; if one appeared, the read lets go and starts again (a part
    /// of the tree appears once, so this ends).
    pub fn read(&self, first: u64, last: u64) -> Locked<RwLockReadGuard<'_, Option<Chunk>>> {
        loop {
            let locked = Locked::range(first, last, |i| {
                self.find(i)
                    .map(|s| s.read().unwrap_or_else(PoisonError::into_inner))
            });
            if self.settled(&locked) {
                return locked;
            }
        }
    }

    /// Whether every chunk `locked` found without a slot still has none
    /// (see [`ChunkTable::read`]).
    fn settled<G>(&self, locked: &Locked<G>) -> bool {
        locked.missing().all(|i| self.find(i).is_none())
    }

    /// Every allocated chunk as it is at one moment, by chunk number
    /// (each shared, not copied: a write after this copies the chunk
    /// first, as it does for a READ that lent it).
    ///
    /// The moment: a read lock on every slot of the tree, taken in
    /// ascending order as every command takes its own, and all held at
    /// once, so each write is wholly before it or wholly after, and a
    /// write issued after another was answered is after it whenever that
    /// other one is (the locks are a cut no write crosses). Parts of the
    /// tree never made have no lock: as in [`ChunkTable::read`], they are
    /// looked up again once every lock is held, and if one appeared the
    /// walk lets go and starts again (a part appears once, so this ends).
    /// Reads go on meanwhile; writes wait for the walk, a few loads per
    /// 64 KiB chunk of the tree.
    pub fn cut(&self) -> Vec<(u64, Chunk)> {
        loop {
            let mut held = Vec::new();
            let mut missing = Vec::new();
            lock_all(&self.root, self.levels, 0, &mut held, &mut missing);
            if missing.iter().all(|node| node.get().is_none()) {
                return held
                    .iter()
                    .filter_map(|(i, guard)| Some((*i, Arc::clone(guard.as_ref()?))))
                    .collect();
            }
        }
    }

    /// A table of the same reach holding `chunks` (from [`ChunkTable::cut`]).
    pub fn with_chunks(levels_of: &ChunkTable, chunks: Vec<(u64, Chunk)>) -> ChunkTable {
        let table = ChunkTable {
            levels: levels_of.levels,
            root: Node::new(levels_of.levels, FAN),
            allocated: AtomicU64::new(0),
        };
        for (i, chunk) in chunks {
            if let Some(slot) = table.slot(i) {
                *slot.write().unwrap_or_else(PoisonError::into_inner) = Some(chunk);
                table.count(true);
            }
        }
        table
    }

    /// Write locks on chunks `first..=last`, in ascending order.
    pub fn write(&self, first: u64, last: u64) -> Locked<RwLockWriteGuard<'_, Option<Chunk>>> {
        Locked::range(first, last, |i| {
            self.slot(i)
                .map(|s| s.write().unwrap_or_else(PoisonError::into_inner))
        })
    }
}

/// Read locks on every slot under `node` (`level` levels above the slots,
/// first chunk `base`) in ascending order, into `held`; the parts of the
/// tree not made yet into `missing` (see [`ChunkTable::cut`]).
fn lock_all<'a>(
    node: &'a Node,
    level: u32,
    base: u64,
    held: &mut Vec<(u64, RwLockReadGuard<'a, Option<Chunk>>)>,
    missing: &mut Vec<&'a OnceLock<Node>>,
) {
    match node {
        Node::Slots(slots) => held.extend(
            (base..)
                .zip(slots.iter())
                .map(|(i, slot)| (i, slot.read().unwrap_or_else(PoisonError::into_inner))),
        ),
        Node::Inner(children) => {
            let span = 1u64.checked_shl((level - 1) * FAN_BITS).unwrap_or(0);
            for (i, child) in (0u64..).zip(children.iter()) {
                match child.get() {
                    Some(child) => lock_all(
                        child,
                        level - 1,
                        base.wrapping_add(i.wrapping_mul(span)),
                        held,
                        missing,
                    ),
                    None => missing.push(child),
                }
            }
        }
    }
}

/// The first allocated chunk at or after `from` under `node`, which is
/// `level` levels above the slots and whose first chunk is `base`.
fn next_in(node: &Node, level: u32, base: u64, from: u64) -> Option<u64> {
    match node {
        Node::Slots(slots) => slots.iter().zip(base..).find_map(|(slot, i)| {
            let held = i >= from
                && slot
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .is_some();
            held.then_some(i)
        }),
        Node::Inner(children) => {
            let span = 1u64 << ((level - 1) * FAN_BITS);
            children.iter().enumerate().find_map(|(i, child)| {
                let start = base.checked_add((i as u64).checked_mul(span)?)?;
                if start.saturating_add(span) <= from {
                    return None;
                }
                next_in(child.get()?, level - 1, start, from)
            })
        }
    }
}

/// The locks one command holds: the guards of its chunks `first..`, by
/// chunk number. One chunk (a small command) needs no allocation.
pub(super) struct Locked<G> {
    first: u64,
    guards: Guards<G>,
}

enum Guards<G> {
    One(Option<G>),
    Many(Vec<Option<G>>),
}

impl<G> Locked<G> {
    /// `lock` of each chunk of `first..=last`, in ascending order.
    fn range(first: u64, last: u64, mut lock: impl FnMut(u64) -> Option<G>) -> Self {
        let guards = if first == last {
            Guards::One(lock(first))
        } else {
            Guards::Many((first..=last).map(lock).collect())
        };
        Self { first, guards }
    }

    /// The chunks of the range that have no guard (their part of the tree
    /// did not exist when they were locked). A range of one chunk has none
    /// to report: a read of one chunk cannot be torn by a missing slot.
    fn missing(&self) -> impl Iterator<Item = u64> + '_ {
        let many: &[Option<G>] = match &self.guards {
            Guards::One(_) => &[],
            Guards::Many(v) => v,
        };
        (self.first..)
            .zip(many)
            .filter_map(|(i, g)| g.is_none().then_some(i))
    }

    /// The guard of chunk `chunk` (`None`: outside the range, or a chunk
    /// whose part of the tree was never made).
    pub fn get_mut(&mut self, chunk: u64) -> Option<&mut G> {
        let i = usize::try_from(chunk.checked_sub(self.first)?).ok()?;
        match &mut self.guards {
            Guards::One(g) if i == 0 => g.as_mut(),
            Guards::One(_) => None,
            Guards::Many(v) => v.get_mut(i)?.as_mut(),
        }
    }
}

impl<G: std::ops::Deref<Target = Option<Chunk>>> Locked<G> {
    /// Chunk `chunk`, if it is allocated.
    pub fn chunk(&mut self, chunk: u64) -> Option<&Chunk> {
        self.get_mut(chunk)?.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_cover_the_size_and_a_growth_to_64_tib() {
        for (chunks, levels) in [
            (1, 3),
            (1024, 3),
            (1 << 30, 3),
            ((1 << 30) + 1, 4),
            (u64::MAX, 7),
        ] {
            let t = ChunkTable::new(chunks);
            assert_eq!(t.levels, levels, "{chunks} chunks");
            // The last chunk has a slot, and nothing was made for it
            // before it was asked for.
            assert!(t.slot(chunks - 1).is_some());
        }
        assert_eq!(ChunkTable::new(1).reach(), 1 << 30, "64 TiB");
        assert_eq!(ChunkTable::new(u64::MAX).reach(), u64::MAX);
        let t = ChunkTable::new(3 << 20);
        assert!(t.find((2 << 20) + 5).is_none(), "never written");
        assert!(t.slot((2 << 20) + 5).is_some());
        assert!(t.find((2 << 20) + 5).is_some());
        assert!(t.find((2 << 20) + 1024).is_none(), "a sibling node");
    }

    #[test]
    fn the_next_allocated_chunk_is_found_across_nodes() {
        let t = ChunkTable::new(1 << 20);
        assert_eq!(t.next_allocated(0), None);
        for i in [5u64, 1023, 1024, 700_000] {
            *t.slot(i).unwrap().write().unwrap() =
                Some(std::sync::Arc::new(super::super::chunk::ChunkData::zeroed()));
        }
        // A slot made but empty is skipped.
        t.slot(2000).unwrap();
        assert_eq!(t.next_allocated(0), Some(5));
        assert_eq!(t.next_allocated(5), Some(5));
        assert_eq!(t.next_allocated(6), Some(1023));
        assert_eq!(t.next_allocated(1024), Some(1024));
        assert_eq!(t.next_allocated(1025), Some(700_000));
        assert_eq!(t.next_allocated(700_001), None);
        assert_eq!(t.next_allocated(u64::MAX), None);
    }

    /// The interleaving a timing test can hardly hit: a read passes chunk
    /// 1023 (its node missing), then a write makes the nodes of 1023 and
    /// 1024 before the read reaches 1024. The read must see that and
    /// start again rather than return zeros beside the new chunk.
    #[test]
    fn a_read_that_raced_a_new_node_starts_again() {
        let t = ChunkTable::new(4096);
        let locked = Locked::range(1023, 1024, |i| {
            if i == 1024 {
                // The writer runs here.
                t.slot(1023).unwrap();
                t.slot(1024).unwrap();
            }
            t.find(i)
                .map(|s| s.read().unwrap_or_else(PoisonError::into_inner))
        });
        assert_eq!(locked.missing().collect::<Vec<_>>(), [1023]);
        assert!(!t.settled(&locked), "a slot appeared: read again");
        drop(locked);
        let again = t.read(1023, 1024);
        assert_eq!(again.missing().count(), 0);
        assert!(
            t.settled(&t.read(4000, 4095)),
            "never written: zeros, settled"
        );
    }
}
