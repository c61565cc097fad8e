//! [`AsyncIo`]: reads and writes that complete without holding a thread.
//!
//! A store whose I/O goes over the network (RBD: a round trip to an OSD
//! per command) spends most of a command waiting. Through the synchronous
//! [`Backstore`](super::Backstore) methods every waiting command holds a
//! thread of the target's blocking pool, and each one costs two thread
//! hand-offs (to the pool and back) on top of the store's own. A store that
//! can do better offers this interface ([`Backstore::async_io`](super::Backstore::async_io)):
//! the target starts the I/O on its own task and is woken when it is done.
//!
//! Both methods take their memory by value and give it back (or drop it)
//! only once the store is done with it: a future dropped before the I/O
//! completes must not leave the store writing into freed memory, so the
//! store, not the future, owns the buffer while the I/O runs.

use std::future::Future;
use std::io;
use std::pin::Pin;

/// A future a store's I/O returns: sent between threads, owned.
pub type IoFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Memory an asynchronous write reads from.
///
/// The store keeps the box untouched until the write completes and reads
/// the bytes of [`WriteData::slices`] all that time: boxed, they do not
/// move when the box does, and nothing changes them while the box is held
/// (a `&[u8]` borrowed from `&self` is immutable memory for safe code).
pub trait WriteData: Send + 'static {
    /// The bytes, in order; together at least the write's length.
    fn slices(&self) -> Vec<&[u8]>;
}

impl WriteData for Vec<u8> {
    fn slices(&self) -> Vec<&[u8]> {
        vec![self.as_slice()]
    }
}

/// Reads and writes that complete asynchronously (see the module).
pub trait AsyncIo: Send + Sync {
    /// Fills all of `buf` from byte `offset`; the buffer comes back with
    /// the result, whatever it is.
    fn read(&self, offset: u64, buf: Vec<u8>) -> IoFuture<(Vec<u8>, io::Result<()>)>;

    /// Writes the first `len` bytes of `data` at byte `offset`: on stable
    /// storage when it completes if `through` (FUA, or the write cache
    /// off). `data` is dropped once the store is done with it.
    fn write(
        &self,
        offset: u64,
        data: Box<dyn WriteData>,
        len: usize,
        through: bool,
    ) -> IoFuture<io::Result<()>>;

    /// After a read or write failed with [`io::ErrorKind::WouldBlock`]
    /// ("again soon"): resolves when sending the command again is worth it
    /// (a fenced RBD client has rejoined), or when the store stops waiting
    /// for that. The command holds nothing of the LU meanwhile (what the
    /// store waits for may itself wait for the LU's writes). At once unless
    /// the store says otherwise.
    fn ready(&self) -> IoFuture<()> {
        Box::pin(std::future::ready(()))
    }
}
