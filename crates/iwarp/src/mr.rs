//! Memory registration (RFC 5040 §5.2, RFC 5041 §3): the protection domain
//! owns every registered buffer; an STag names one with its access rights,
//! and every tagged placement or Read source is checked against them here.

use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;

/// Rights a region is registered with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access(u8);

impl Access {
    /// No rights beyond local reading.
    pub const NONE: Access = Access(0);
    /// Local placement (RDMA Read sink, receive).
    pub const LOCAL_WRITE: Access = Access(1);
    /// The peer may RDMA Read it.
    pub const REMOTE_READ: Access = Access(2);
    /// The peer may RDMA Write it.
    pub const REMOTE_WRITE: Access = Access(4);

    /// Whether every right in `other` is in `self`.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// The region `stag` names, if `len` bytes at tagged offset `to` lie in
/// it and it grants `need`; with the region-relative start (RFC 5041 §7:
/// the STag, base and bounds, and access checks of tagged placement).
fn locate(
    t: &mut Table,
    stag: u32,
    to: u64,
    len: usize,
    need: Access,
) -> Result<(&mut Region, usize), Refusal> {
    let r = t
        .get(stag)
        .filter(|r| r.valid)
        .ok_or(Refusal::InvalidStag)?;
    if !r.access.contains(need) {
        return Err(Refusal::Access);
    }
    let start = to.checked_sub(r.base).ok_or(Refusal::Bounds)?;
    let start = usize::try_from(start).map_err(|_| Refusal::Bounds)?;
    let end = start.checked_add(len).ok_or(Refusal::Bounds)?;
    if end > r.buf.len() {
        return Err(Refusal::Bounds);
    }
    if matches!(r.buf, Memory::Frozen(_)) && need != Access::REMOTE_READ {
        return Err(Refusal::Access);
    }
    if matches!(r.buf, Memory::Pages(_)) && need == Access::REMOTE_READ {
        return Err(Refusal::Access);
    }
    Ok((r, start))
}

/// A region's buffer out of the table while the reader places into it.
pub(crate) struct Placement {
    stag: u32,
    /// The region's bytes.
    buf: Memory,
    /// Where the placement starts in the region.
    start: usize,
}

impl Placement {
    /// The `len` bytes being placed, as the slices of the region's memory
    /// they lie in (one, but for a page-list region).
    pub(crate) fn destination(&mut self, len: usize) -> Vec<&mut [u8]> {
        self.buf.slices_mut(self.start, len)
    }
}

/// Why a tagged access was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No such STag, or it was invalidated.
    InvalidStag,
    /// The range is not inside the region.
    Bounds,
    /// The region lacks the right.
    Access,
}

/// A region's bytes: a buffer the PD owns, frozen bytes shared with the
/// caller (registered for the peer to read: they go on the wire as they
/// are, with no copy), or pages in order (a page-list region, as a
/// fast-registration MR maps scattered pages: placed into, never read by
/// the peer, so that a target's write data lands in the buffers it keeps).
enum Memory {
    Owned(Vec<u8>),
    Frozen(Bytes),
    Pages(Vec<Vec<u8>>),
}

impl Memory {
    fn len(&self) -> usize {
        match self {
            Memory::Owned(v) => v.len(),
            Memory::Frozen(b) => b.len(),
            Memory::Pages(pages) => pages.iter().map(Vec::len).sum(),
        }
    }

    /// The bytes as one slice (`None` for pages, which are not a source).
    fn bytes(&self) -> Option<&[u8]> {
        match self {
            Memory::Owned(v) => Some(v),
            Memory::Frozen(b) => Some(b),
            Memory::Pages(_) => None,
        }
    }

    /// Bytes `start..start + len` (in bounds: checked by `locate`) as the
    /// slices they lie in.
    fn slices_mut(&mut self, start: usize, len: usize) -> Vec<&mut [u8]> {
        let end = start + len;
        match self {
            Memory::Pages(pages) => {
                let mut slices = Vec::new();
                let mut base = 0;
                for page in pages.iter_mut() {
                    let page_len = page.len();
                    let (from, to) = (start.max(base), end.min(base + page_len));
                    if from < to {
                        slices.push(&mut page[from - base..to - base]);
                    }
                    base += page_len;
                    if base >= end {
                        break;
                    }
                }
                slices
            }
            other => vec![&mut other.bytes_mut()[start..end]],
        }
    }

    /// Copies `data` in at `start` (in bounds).
    fn write_at(&mut self, start: usize, data: &[u8]) {
        let mut at = 0;
        for slice in self.slices_mut(start, data.len()) {
            let n = slice.len();
            slice.copy_from_slice(&data[at..at + n]);
            at += n;
        }
    }

    /// The bytes, writable: frozen bytes are copied into a buffer of the
    /// region's own first (only local access can ask: the peer never has
    /// write rights to a frozen region).
    /// Pages are joined into one buffer (only `with_region` asks it of
    /// a page-list region, and gets its pages back after: see there).
    fn bytes_mut(&mut self) -> &mut Vec<u8> {
        match self {
            Memory::Frozen(b) => *self = Memory::Owned(b.to_vec()),
            Memory::Pages(pages) => *self = Memory::Owned(pages.concat()),
            Memory::Owned(_) => {}
        }
        match self {
            Memory::Owned(v) => v,
            _ => unreachable!("made owned just above"),
        }
    }

    /// The buffer back: frozen bytes nobody else holds become a `Vec`
    /// without a copy; otherwise an empty one.
    fn into_vec(self) -> Vec<u8> {
        match self {
            Memory::Owned(v) => v,
            Memory::Frozen(b) => b.try_into_mut().map(Vec::from).unwrap_or_default(),
            Memory::Pages(pages) => pages.concat(),
        }
    }

    /// The pages back (a buffer of another kind as one page).
    fn into_pages(self) -> Vec<Vec<u8>> {
        match self {
            Memory::Pages(pages) => pages,
            other => vec![other.into_vec()],
        }
    }
}

struct Region {
    buf: Memory,
    /// The length registered, which the bounds of a work request are
    /// checked against: `buf` reads as empty while the reader has it out
    /// for a placement ([`ProtectionDomain::checkout`]), and a request for
    /// another range of the region may be posted meanwhile (many RDMA
    /// Reads into one sink, each placed as its response arrives).
    len: usize,
    access: Access,
    base: u64,
    valid: bool,
}

#[derive(Default)]
struct Slot {
    key: u8,
    region: Option<Region>,
}

#[derive(Default)]
struct Table {
    slots: Vec<Slot>,
    free: Vec<u32>,
}

impl Table {
    fn get(&mut self, stag: u32) -> Option<&mut Region> {
        let slot = self.slots.get_mut((stag >> 8) as usize)?;
        if slot.key != stag as u8 {
            return None;
        }
        slot.region.as_mut()
    }
}

/// The memory regions of one connection (a PD per QP, cheap to clone).
#[derive(Clone, Default)]
pub struct ProtectionDomain {
    table: Arc<Mutex<Table>>,
}

/// A registered region. Not Clone: it is the capability to deregister.
#[derive(Debug)]
pub struct MemoryRegion {
    stag: u32,
    addr: u64,
    len: usize,
}

impl MemoryRegion {
    /// The STag (= rkey = lkey here): the upper 24 bits index the PD's
    /// table, the low 8 are a key that changes with each registration so a
    /// stale STag is not taken for a new region.
    pub fn stag(&self) -> u32 {
        self.stag
    }
    /// The tagged offset of byte 0 (a unique base per slot, not a pointer).
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Bytes registered.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl ProtectionDomain {
    /// A domain with no regions.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers `buffer` (ownership moves to the PD until deregistered).
    /// The region's first byte has the tagged offset `mr.addr()`: absolute
    /// (not zero-based), like Linux iser/siw, with a base unique per slot.
    ///
    /// # Panics
    /// When 2^24 regions are registered at once.
    pub fn register(&self, buffer: Vec<u8>, access: Access) -> MemoryRegion {
        self.insert(Memory::Owned(buffer), access)
    }

    /// Registers `bytes` for the peer to read (and for local reading): an
    /// RDMA Read Response goes on the wire straight from them, with no
    /// copy. Rights to write are not granted, whatever `access` says: the
    /// bytes are shared and stay as they are.
    ///
    /// # Panics
    /// When 2^24 regions are registered at once.
    pub fn register_frozen(&self, bytes: Bytes, access: Access) -> MemoryRegion {
        let access = Access(access.0 & Access::REMOTE_READ.0);
        self.insert(Memory::Frozen(bytes), access)
    }

    /// Registers `pages` as one region, in order (a page-list region): the
    /// peer may write it, and it may be an RDMA Read's sink, but it is
    /// never read by the peer (`REMOTE_READ` is not granted) or sent from;
    /// [`ProtectionDomain::deregister_pages`] gives the pages back as they
    /// were registered, with what was placed in them.
    ///
    /// # Panics
    /// When 2^24 regions are registered at once.
    pub fn register_pages(&self, pages: Vec<Vec<u8>>, access: Access) -> MemoryRegion {
        let access = Access(access.0 & (Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0));
        self.insert(Memory::Pages(pages), access)
    }

    fn insert(&self, buffer: Memory, access: Access) -> MemoryRegion {
        let mut t = self.lock();
        let index = match t.free.pop() {
            Some(i) => i,
            None => {
                t.slots.push(Slot::default());
                (t.slots.len() - 1) as u32
            }
        };
        assert!(index < 1 << 24, "too many registered regions");
        let base = (u64::from(index) + 1) << 40;
        let len = buffer.len();
        let slot = &mut t.slots[index as usize];
        // Keys run 1..=255 so that no STag is ever 0.
        slot.key = if slot.key == 255 { 1 } else { slot.key + 1 };
        slot.region = Some(Region {
            buf: buffer,
            len,
            access,
            base,
            valid: true,
        });
        MemoryRegion {
            stag: (index << 8) | u32::from(slot.key),
            addr: base,
            len,
        }
    }

    /// Ends the registration and gives the buffer back (with whatever the
    /// peer placed in it). A region of another PD gives an empty Vec.
    pub fn deregister(&self, mr: MemoryRegion) -> Vec<u8> {
        self.remove(mr).map(Memory::into_vec).unwrap_or_default()
    }

    /// [`ProtectionDomain::deregister`] for a page-list region: its pages
    /// as registered (any other region's buffer as one page; empty for a
    /// region of another PD).
    pub fn deregister_pages(&self, mr: MemoryRegion) -> Vec<Vec<u8>> {
        self.remove(mr).map(Memory::into_pages).unwrap_or_default()
    }

    /// Ends `mr`'s registration: its memory, if it is this PD's.
    fn remove(&self, mr: MemoryRegion) -> Option<Memory> {
        let mut t = self.lock();
        let index = mr.stag >> 8;
        let slot = t.slots.get_mut(index as usize)?;
        if slot.key != mr.stag as u8 {
            return None;
        }
        let region = slot.region.take()?;
        t.free.push(index);
        Some(region.buf)
    }

    /// Runs `f` over the registered bytes. Must not be called from inside
    /// another `with_region` on the same PD (the PD's lock is held).
    ///
    /// # Panics
    /// If `mr` is not registered in this PD.
    pub fn with_region<R>(&self, mr: &MemoryRegion, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut t = self.lock();
        let region = t
            .get(mr.stag)
            .expect("with_region: the region is not in this PD");
        // A page-list region is joined for `f`, then cut into its pages again.
        let page_lens: Option<Vec<usize>> = match &region.buf {
            Memory::Pages(pages) => Some(pages.iter().map(Vec::len).collect()),
            _ => None,
        };
        let result = f(region.buf.bytes_mut());
        if let Some(lens) = page_lens {
            let joined = std::mem::take(region.buf.bytes_mut());
            let mut at = 0;
            let pages = lens
                .into_iter()
                .map(|n| {
                    at += n;
                    joined[at - n..at].to_vec()
                })
                .collect();
            region.buf = Memory::Pages(pages);
        }
        result
    }

    /// Whether `stag` names a valid region of this PD (not invalidated).
    pub fn is_valid(&self, stag: u32) -> bool {
        self.lock().get(stag).is_some_and(|r| r.valid)
    }

    /// Invalidates `stag` (local invalidation, or a peer's Send with
    /// Invalidate). False if the STag is unknown or already invalid.
    pub fn invalidate(&self, stag: u32) -> bool {
        match self.lock().get(stag) {
            Some(r) if r.valid => {
                r.valid = false;
                true
            }
            _ => false,
        }
    }

    /// The tagged offset of `stag`'s first byte.
    pub(crate) fn addr_of(&self, stag: u32) -> Option<u64> {
        self.lock().get(stag).map(|r| r.base)
    }

    /// Checks a local range (an API argument) for `need`.
    pub(crate) fn check_local(
        &self,
        stag: u32,
        offset: usize,
        len: usize,
        need: Access,
    ) -> Result<(), String> {
        let mut t = self.lock();
        let Some(r) = t.get(stag) else {
            return Err(format!("unknown local STag {stag:#x}"));
        };
        if !r.valid {
            return Err(format!("local STag {stag:#x} was invalidated"));
        }
        if !r.access.contains(need) {
            return Err(format!("local STag {stag:#x} lacks {need:?}"));
        }
        if offset.checked_add(len).is_none_or(|end| end > r.len) {
            return Err(format!(
                "{len} bytes at {offset} do not fit STag {stag:#x} of {} bytes",
                r.len
            ));
        }
        Ok(())
    }

    /// Places `data` at tagged offset `to` of `stag`, which must hold `need`.
    pub(crate) fn place(
        &self,
        stag: u32,
        to: u64,
        data: &[u8],
        need: Access,
    ) -> Result<(), Refusal> {
        let mut t = self.lock();
        let (r, start) = locate(&mut t, stag, to, data.len(), need)?;
        r.buf.write_at(start, data);
        Ok(())
    }

    /// Takes a region's buffer out for direct placement: the reader then
    /// receives `len` bytes from the socket straight into
    /// `buf[start..start + len]` without holding the table's lock across
    /// the wait, and puts it back with [`ProtectionDomain::checkin`]. The
    /// same checks as [`ProtectionDomain::place`]. While it is out, the
    /// region reads as empty (any other placement or read of its bytes
    /// fails its bounds check; a work request posted meanwhile is checked
    /// against the length registered, [`ProtectionDomain::check_local`]):
    /// only the stream's single reader places, and a region is not used
    /// locally before its placement completed (the Read's completion, the
    /// response that follows the Writes).
    pub(crate) fn checkout(
        &self,
        stag: u32,
        to: u64,
        len: usize,
        need: Access,
    ) -> Result<Placement, Refusal> {
        let mut t = self.lock();
        let (r, start) = locate(&mut t, stag, to, len, need)?;
        let buf = match &mut r.buf {
            Memory::Pages(pages) => Memory::Pages(std::mem::take(pages)),
            other => Memory::Owned(std::mem::take(other.bytes_mut())),
        };
        Ok(Placement { stag, buf, start })
    }

    /// Puts a checked-out buffer back (dropped if its region was
    /// deregistered meanwhile).
    pub(crate) fn checkin(&self, placement: Placement) {
        let mut t = self.lock();
        if let Some(r) = t.get(placement.stag)
            && r.buf.len() == 0
        {
            r.buf = placement.buf;
        }
    }

    /// Checks that `len` bytes at tagged offset `to` of `stag` may be read
    /// by the peer; returns the region-relative offset.
    pub(crate) fn check_remote_read(
        &self,
        stag: u32,
        to: u64,
        len: usize,
    ) -> Result<usize, Refusal> {
        let mut t = self.lock();
        let r = t
            .get(stag)
            .filter(|r| r.valid)
            .ok_or(Refusal::InvalidStag)?;
        if !r.access.contains(Access::REMOTE_READ) {
            return Err(Refusal::Access);
        }
        let start = to.checked_sub(r.base).ok_or(Refusal::Bounds)?;
        let start = usize::try_from(start).map_err(|_| Refusal::Bounds)?;
        if start.checked_add(len).is_none_or(|end| end > r.buf.len()) {
            return Err(Refusal::Bounds);
        }
        Ok(start)
    }

    /// Bytes `offset..offset + len` of region `stag` when it was
    /// registered frozen ([`ProtectionDomain::register_frozen`]): they go
    /// on the wire without a copy. `None` for any other region.
    pub(crate) fn frozen(&self, stag: u32, offset: usize, len: usize) -> Option<Bytes> {
        let mut t = self.lock();
        match &t.get(stag)?.buf {
            Memory::Frozen(b) if offset.checked_add(len)? <= b.len() => {
                Some(b.slice(offset..offset + len))
            }
            _ => None,
        }
    }

    /// Runs `f` over bytes `offset..offset + len` of region `stag`, under
    /// the table's lock; false if the region or the range is gone.
    pub(crate) fn with_bytes(
        &self,
        stag: u32,
        offset: usize,
        len: usize,
        f: impl FnOnce(&[u8]),
    ) -> bool {
        let mut t = self.lock();
        match t
            .get(stag)
            .and_then(|r| r.buf.bytes()?.get(offset..offset + len))
        {
            Some(bytes) => {
                f(bytes);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stags_checks_and_invalidation() {
        let pd = ProtectionDomain::new();
        let mr = pd.register(vec![0; 16], Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        assert_ne!(mr.stag(), 0);
        assert_eq!(
            pd.place(mr.stag(), mr.addr() + 4, b"abcd", Access::REMOTE_WRITE),
            Ok(())
        );
        assert_eq!(
            pd.place(mr.stag(), mr.addr() + 14, b"abcd", Access::REMOTE_WRITE),
            Err(Refusal::Bounds)
        );
        assert_eq!(
            pd.place(mr.stag(), mr.addr() - 1, b"a", Access::REMOTE_WRITE),
            Err(Refusal::Bounds)
        );
        assert_eq!(
            pd.check_remote_read(mr.stag(), mr.addr(), 1),
            Err(Refusal::Access)
        );
        assert_eq!(
            pd.place(mr.stag() ^ 1, mr.addr(), b"a", Access::REMOTE_WRITE),
            Err(Refusal::InvalidStag)
        );
        assert!(pd.invalidate(mr.stag()));
        assert!(!pd.invalidate(mr.stag()));
        assert_eq!(
            pd.place(mr.stag(), mr.addr(), b"a", Access::REMOTE_WRITE),
            Err(Refusal::InvalidStag)
        );
        let old = mr.stag();
        let buf = pd.deregister(mr);
        assert_eq!(&buf[4..8], b"abcd");
        let again = pd.register(vec![0; 4], Access::REMOTE_READ);
        assert_ne!(again.stag(), old, "a re-used slot gets a new key");
        assert_eq!(pd.check_remote_read(again.stag(), again.addr(), 4), Ok(0));
    }

    #[test]
    fn frozen_regions_are_read_only_and_shared() {
        let pd = ProtectionDomain::new();
        let bytes = Bytes::from(b"frozen bytes".to_vec());
        let mr = pd.register_frozen(bytes.clone(), Access::REMOTE_READ | Access::REMOTE_WRITE);
        assert_eq!(
            pd.place(mr.stag(), mr.addr(), b"x", Access::REMOTE_WRITE),
            Err(Refusal::Access)
        );
        assert!(
            pd.checkout(mr.stag(), mr.addr(), 1, Access::REMOTE_WRITE)
                .is_err()
        );
        assert_eq!(pd.check_remote_read(mr.stag(), mr.addr() + 7, 5), Ok(7));
        let slice = pd.frozen(mr.stag(), 7, 5).expect("frozen");
        assert_eq!(&slice[..], b"bytes");
        assert_eq!(slice.as_ptr(), bytes[7..].as_ptr(), "shared, not copied");
        assert!(pd.frozen(mr.stag(), 7, 6).is_none(), "out of bounds");
        // Local mutable access copies the bytes into a buffer of the
        // region's own: the caller's stay as they were.
        pd.with_region(&mr, |b| b[0] = b'F');
        assert!(pd.frozen(mr.stag(), 0, 1).is_none());
        assert_eq!(&bytes[..], b"frozen bytes");
        assert_eq!(pd.deregister(mr), b"Frozen bytes");
        // Deregistered while another holder keeps the bytes: nothing to
        // give back without a copy.
        let mr = pd.register_frozen(bytes.clone(), Access::REMOTE_READ);
        assert!(pd.deregister(mr).is_empty());
        drop(bytes);
    }

    /// Many RDMA Reads into one sink: the reader has the region out to
    /// place one response while the next request is posted. Its bounds
    /// are the region's registered length, not the empty buffer left in
    /// the table (CI saw "65536 bytes at 983040 do not fit STag 0x1 of 0
    /// bytes" in `many_reads_beyond_ord_wait_in_order`).
    #[test]
    fn a_request_posted_while_its_region_is_placed_into_is_checked_against_its_length() {
        let pd = ProtectionDomain::new();
        let mr = pd.register(vec![0; 64], Access::LOCAL_WRITE);
        let placement = pd
            .checkout(mr.stag(), mr.addr(), 16, Access::LOCAL_WRITE)
            .expect("checkout");
        assert_eq!(
            pd.check_local(mr.stag(), 48, 16, Access::LOCAL_WRITE),
            Ok(())
        );
        assert!(
            pd.check_local(mr.stag(), 48, 17, Access::LOCAL_WRITE)
                .is_err()
        );
        // Placement itself still waits for the buffer to come back.
        assert_eq!(
            pd.place(mr.stag(), mr.addr() + 32, b"x", Access::LOCAL_WRITE),
            Err(Refusal::Bounds)
        );
        pd.checkin(placement);
        assert_eq!(
            pd.place(mr.stag(), mr.addr() + 32, b"x", Access::LOCAL_WRITE),
            Ok(())
        );
        assert_eq!(pd.deregister(mr).len(), 64);
    }
}
