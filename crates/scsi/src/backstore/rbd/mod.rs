//! [`RbdBackstore`]: a Ceph RBD image through librbd, on a RADOS client of
//! its own (one per LU, so that blocklisting one LU's client — the fencing
//! of a later gateway group — fences nothing else).
//!
//! This first step calls librbd synchronously from the [`Backstore`]
//! methods: the store answers `may_block()`, so the target runs its
//! commands on a thread pool and a slow OSD holds one pool thread, not the
//! connection. librbd's AIO with completions through an eventfd into tokio
//! is the next step (issue 36).
//!
//! All `unsafe` is in [`ffi`].

mod ffi;
mod gateway;

use std::fmt;
use std::io;
use std::sync::Arc;

use crate::alua::{AluaGroup, AluaView, GatewayGroup};

use super::{Backstore, BackstoreOpenError, check_block_size, check_range};

/// What `rbd:POOL/IMAGE[,conf=PATH][,id=USER]` names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RbdSpec {
    /// The pool.
    pub pool: String,
    /// The image.
    pub image: String,
    /// The ceph.conf to read; `None`: librados's default search.
    pub conf: Option<String>,
    /// The cephx user without `client.`; `None`: `admin`.
    pub id: Option<String>,
}

/// Options this gateway sets on its RADOS client, after the conf file (so
/// they win over it), and why:
/// - `rbd_cache=false`: a write completes only when the OSDs hold it, so
///   FUA and SYNCHRONIZE CACHE cost nothing extra and nothing acknowledged
///   sits in one gateway's memory — which a failover to another gateway
///   would lose (tcmu-runner does the same).
/// - `rbd_skip_partial_discard=false`: Pacific skips discards smaller than
///   `rbd_discard_granularity_bytes` (64 KiB) by default, leaving the old
///   data; UNMAP must leave zeros (LBPRZ), so partial ranges are zeroed.
/// - `client_mount_timeout=10`: an unreachable cluster fails the LUN in
///   10 s with a message naming the monitors, instead of librados's 300 s.
const CLIENT_OPTIONS: &[(&str, &str)] = &[
    ("rbd_cache", "false"),
    ("rbd_skip_partial_discard", "false"),
    ("client_mount_timeout", "10"),
];

/// An RBD image as a logical unit's medium.
pub struct RbdBackstore {
    /// Stops the keeper (first: it uses the image) when the store goes.
    _keeper: Option<gateway::Keeper>,
    /// The LU's ALUA view, which the keeper sets; `None` outside a group.
    alua: Option<Arc<AluaGroup>>,
    /// Tripped by an I/O that finds this client blocklisted (in a group).
    fence: Option<Arc<gateway::Fence>>,
    image: Arc<ffi::Image>,
    spec: RbdSpec,
    block_size: u32,
    block_count: u64,
    unique_id: u64,
}

impl fmt::Debug for RbdBackstore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RbdBackstore")
            .field("pool", &self.spec.pool)
            .field("image", &self.spec.image)
            .field("block_size", &self.block_size)
            .field("block_count", &self.block_count)
            .finish()
    }
}

impl RbdBackstore {
    /// Connects to the cluster `spec` names and opens its image, with
    /// logical blocks of `block_size` bytes. The image's size must be a
    /// multiple of `block_size`. The error names the step that failed (the
    /// monitors tried, the pool, the image) and librados's reason.
    ///
    /// The LU identifier comes from the cluster's fsid, the pool and the
    /// image's id, not from the target's name: every gateway that exports
    /// the image reports the same identifier, which multipath needs to see
    /// one device behind several gateways.
    pub fn open(spec: &RbdSpec, block_size: u32) -> Result<RbdBackstore, BackstoreOpenError> {
        Self::open_in_group(spec, block_size, None)
    }

    /// [`RbdBackstore::open`] for a gateway of `group`: the LU answers with
    /// implicit ALUA, and a keeper thread decides from the cluster which
    /// gateway owns it (the image's exclusive lock; see `gateway.rs`). It
    /// starts transitioning on every port until the first look.
    pub fn open_in_group(
        spec: &RbdSpec,
        block_size: u32,
        group: Option<&GatewayGroup>,
    ) -> Result<RbdBackstore, BackstoreOpenError> {
        check_block_size(block_size)?;
        let image = ffi::Image::open(ffi::Target {
            conf: spec.conf.as_deref(),
            id: spec.id.as_deref(),
            pool: &spec.pool,
            image: &spec.image,
            options: CLIENT_OPTIONS,
        })
        .map_err(|e| {
            BackstoreOpenError::Io(io::Error::new(
                e.error.kind(),
                format!("rbd:{}/{}: {}: {}", spec.pool, spec.image, e.step, e.error),
            ))
        })?;
        let named = |what: &str| {
            let spec = spec.clone();
            let what = what.to_owned();
            move |e: io::Error| {
                io::Error::new(
                    e.kind(),
                    format!("rbd:{}/{}: {what}: {e}", spec.pool, spec.image),
                )
            }
        };
        let size = image.size().map_err(named("reading the size"))?;
        if size == 0 || size % u64::from(block_size) != 0 {
            return Err(BackstoreOpenError::InvalidSize { size, block_size });
        }
        let identity = format!(
            "{}/{}/{}",
            image.fsid().map_err(named("reading the cluster's fsid"))?,
            spec.pool,
            image.id().map_err(named("reading the image's id"))?
        );
        let image = Arc::new(image);
        let name = format!("rbd:{}/{}", spec.pool, spec.image);
        let (alua, fence, keeper) = match group {
            None => (None, None, None),
            Some(group) => {
                let alua = Arc::new(AluaGroup::new(AluaView::owned_by(
                    group.members.clone(),
                    None,
                )));
                let fence = Arc::new(gateway::Fence::new(
                    group.port,
                    name.clone(),
                    Arc::clone(&alua),
                ));
                let keeper = gateway::start(
                    Arc::clone(&image),
                    name.clone(),
                    group.clone(),
                    Arc::clone(&alua),
                    Arc::clone(&fence),
                )
                .map_err(named("starting the gateway group's keeper"))?;
                (Some(alua), Some(fence), Some(keeper))
            }
        };
        Ok(RbdBackstore {
            _keeper: keeper,
            alua,
            fence,
            image,
            spec: spec.clone(),
            block_size,
            block_count: size / u64::from(block_size),
            unique_id: fnv1a(identity.as_bytes()),
        })
    }

    /// Passes an I/O error on; in a gateway group, one that says this
    /// client was blocklisted first trips the fence (see `gateway::Fence`).
    fn failed(&self, e: io::Error) -> io::Error {
        match &self.fence {
            Some(fence) => fence.check(e),
            None => e,
        }
    }

    fn size(&self) -> u64 {
        self.block_count * u64::from(self.block_size)
    }
}

/// FNV-1a, 64 bits: a stable hash (the same in every gateway and release).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01B3)
    })
}

impl Backstore for RbdBackstore {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn block_count(&self) -> u64 {
        self.block_count
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(offset, buf.len() as u64, self.size())?;
        self.image.read(offset, buf).map_err(|e| self.failed(e))
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        check_range(offset, buf.len() as u64, self.size())?;
        self.image.write(offset, buf, 0).map_err(|e| self.failed(e))
    }

    /// FUA on the write itself: with the client's cache off a completed
    /// write is on the OSDs already, and the flag keeps it so if a conf
    /// file turns a cache on; no image-wide flush.
    fn write_through(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        check_range(offset, buf.len() as u64, self.size())?;
        self.image
            .write(offset, buf, ffi::OP_FLAG_FADVISE_FUA)
            .map_err(|e| self.failed(e))
    }

    fn write_pieces_through(
        &self,
        offset: u64,
        pieces: &mut [Vec<u8>],
        len: usize,
    ) -> io::Result<()> {
        super::check_pieces(pieces, len)?;
        check_range(offset, len as u64, self.size())?;
        super::for_each_piece(offset, pieces, len, |at, bytes| {
            self.image.write(at, bytes, ffi::OP_FLAG_FADVISE_FUA)
        })
        .map_err(|e| self.failed(e))
    }

    fn flush(&self) -> io::Result<()> {
        self.image.flush().map_err(|e| self.failed(e))
    }

    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(offset, len, self.size())?;
        self.image.discard(offset, len).map_err(|e| self.failed(e))
    }

    fn unique_id(&self) -> u64 {
        self.unique_id
    }

    fn is_thin(&self) -> bool {
        true
    }

    fn alua(&self) -> Option<Arc<AluaGroup>> {
        self.alua.clone()
    }
}

#[cfg(test)]
mod tests;
