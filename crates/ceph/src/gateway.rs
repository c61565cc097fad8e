//! Who of a group of gateways owns an RBD LU: the holder of the image's
//! exclusive lock, kept by a thread per LU (the keeper) that sets the LU's
//! [`AluaGroup`] view from what the cluster says.
//!
//! Liveness is a heartbeat, not a RADOS watch: each gateway bumps a counter
//! in an extended attribute of the image's header object
//! (`iscsi-rs.hb.<port>` of `rbd_header.<image id>`: it goes with the
//! image, and librbd keeps no xattrs there) every [`BEAT`], and a peer whose
//! counter has not moved for `DEAD_AFTER` by the observer's own monotonic
//! clock is dead (no clocks compared between hosts); one whose counter is
//! late and whose liveness port refuses a connection is dead at once
//! (`liveness.rs`: a killed gateway is seen dead in under a second). Ceph 16's C API has no
//! `rados_list_watchers`, so a watch's liveness could only be read back
//! through `rados_notify2`'s Ceph-encoded reply, and watching needs a
//! callback on librados's threads (which the FFI keeps free of Rust code);
//! two synchronous xattr calls per second need neither. A blocklisted
//! gateway cannot write its heartbeat, so it stops looking alive by itself.
//!
//! The owner's port is kept beside the lock (`iscsi-rs.owner` of the same
//! object),
//! written by the gateway that took the lock: every gateway reads the same
//! two facts (who holds the lock, which port wrote `owner`), so all report
//! the same owner. Ownership is sticky: a live owner keeps the LU, even
//! when a preferred or lower-numbered gateway comes back, because taking
//! it back means blocklisting a working gateway and a path flap for every
//! host; a returning gateway is standby until the owner dies. With nobody
//! holding the lock, the preferred gateway (image metadata
//! [`PREFERRED_KEY`]) takes it if it is alive, else the lowest-numbered
//! live one. When the owner dies, the lowest-numbered live other member
//! breaks its lock (which blocklists it: fenced even if it was only
//! paused) and takes it.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::fence::Fence;
use super::liveness::{self, Liveness};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::ffi::Image;
use iscsi_scsi::alua::{AluaGroup, AluaView, GatewayGroup};

/// How often a gateway beats and looks at the lock. With the liveness
/// probe's [`LATE`](super::liveness::LATE), a killed owner is seen dead
/// 0.2 to 0.8 s after its death; a stopped one after
/// [`DEAD_AFTER`](super::liveness::DEAD_AFTER) (3 to 3.3 s). Each look is
/// a handful of RADOS operations on the image's header object.
pub const BEAT: Duration = Duration::from_millis(300);
/// Image metadata naming the gateway (its port number) that should own the
/// image when nobody does (`rbd image-meta set POOL/IMAGE
/// iscsi-rs.preferred-gateway 2`).
pub const PREFERRED_KEY: &str = "iscsi-rs.preferred-gateway";

/// The prefix of this gateway's extended attributes on the header object.
const PREFIX: &str = "iscsi-rs.";
/// The attribute naming the owner's port.
const OWNER: &str = "iscsi-rs.owner";

use super::ffi::rados::EBLOCKLISTED;

/// Who holds the exclusive lock, as the keeper reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Holder {
    /// This gateway.
    Me,
    /// Another client: the member whose port `owner` names, if any.
    Other(Option<u16>),
    /// Nobody.
    Nobody,
}

/// What the keeper does after a look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    /// Nothing: the owner is alive, or another gateway should act.
    Wait,
    /// Take the free lock.
    Acquire,
    /// Break the dead owner's lock (blocklisting it), then take it.
    TakeOver,
}

/// The pure half of a look: from the group, the holder, who is alive and
/// the preferred gateway, the owner to report (`None`: transitioning) and
/// what this gateway does. Every gateway that reads the same facts
/// reports the same owner, and at most one of them acts.
pub(super) fn decide(
    group: &GatewayGroup,
    holder: Holder,
    alive: &dyn Fn(u16) -> bool,
    preferred: Option<u16>,
) -> (Option<u16>, Action) {
    let me = group.port;
    let alive = |m: u16| m == me || alive(m);
    let chosen = |not: Option<u16>| {
        let candidates: Vec<u16> = group
            .members
            .iter()
            .copied()
            .filter(|&m| Some(m) != not && alive(m))
            .collect();
        preferred
            .filter(|p| candidates.contains(p))
            .or_else(|| candidates.first().copied())
    };
    match holder {
        Holder::Me => (Some(me), Action::Wait),
        // The lock of this gateway's former self (killed, restarted): the
        // client that holds it is gone, and this one takes it back.
        Holder::Other(Some(owner)) if owner == me => (None, Action::TakeOver),
        Holder::Other(Some(owner)) if owner != me && alive(owner) => (Some(owner), Action::Wait),
        Holder::Other(dead) => {
            let act = if chosen(dead) == Some(me) {
                Action::TakeOver
            } else {
                Action::Wait
            };
            (None, act)
        }
        Holder::Nobody => {
            let act = if chosen(None) == Some(me) {
                Action::Acquire
            } else {
                Action::Wait
            };
            (None, act)
        }
    }
}

/// The thread that keeps one LU's ownership; stopped (and the lock let go,
/// so that a peer takes over at once) when the store goes.
pub(super) struct Keeper {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper").finish_non_exhaustive()
    }
}

/// Starts the keeper of `image` (`name` as the log names it), the
/// client of `fence`'s generation `generation`, in `group`; it sets
/// `alua`'s view after every look, and ends when that client is fenced
/// (a rejoined client gets a keeper of its own).
pub(super) fn start(
    image: Arc<Image>,
    generation: u64,
    name: String,
    group: GatewayGroup,
    alua: Arc<AluaGroup>,
    fence: Arc<Fence>,
) -> io::Result<Keeper> {
    let object = format!("rbd_header.{}", image.id()?);
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = Arc::clone(&stop);
    let thread = std::thread::Builder::new()
        .name(format!("rbd-keeper-{}", group.port))
        .spawn(move || {
            let mut k = Look {
                image: &image,
                name: &name,
                object: &object,
                group: &group,
                alua: &alua,
                beat: 0,
                port: group.address.and_then(|address| {
                    liveness::liveness_port(address)
                        .inspect_err(|e| {
                            tracing::warn!(
                                image = name,
                                gateway = group.port,
                                %address,
                                error = %e,
                                "no liveness port: a peer sees this gateway's death by its heartbeat alone"
                            );
                        })
                        .ok()
                }),
                liveness: Liveness::default(),
            };
            while !stopping.load(Ordering::Acquire) && fence.serving(generation) {
                if let Err(e) = k.look() {
                    let e = fence.check(generation, e);
                    if e.raw_os_error() == Some(EBLOCKLISTED) {
                        return;
                    }
                    tracing::warn!(image = name, gateway = group.port, error = %e, "a look at the LU's owner failed");
                }
                std::thread::sleep(BEAT);
            }
            if image.is_lock_owner().unwrap_or(false) {
                let _ = image.lock_release();
            }
        })?;
    Ok(Keeper {
        stop,
        thread: Some(thread),
    })
}

/// One keeper's state between looks.
struct Look<'a> {
    image: &'a Image,
    name: &'a str,
    object: &'a str,
    group: &'a GatewayGroup,
    alua: &'a AluaGroup,
    beat: u64,
    /// This gateway's liveness port, written with its heartbeat.
    port: Option<SocketAddr>,
    liveness: Liveness,
}

impl Look<'_> {
    /// Beats, reads the others' beats and the lock, acts, and sets the view.
    fn look(&mut self) -> io::Result<()> {
        let me = self.group.port;
        self.beat += 1;
        self.image.set_xattr(
            self.object,
            &format!("{PREFIX}hb.{me}"),
            liveness::heartbeat(self.beat, self.port).as_bytes(),
        )?;
        let now = Instant::now();
        for &m in self.group.members.iter().filter(|&&m| m != me) {
            let beat = self.image.xattr(self.object, &format!("{PREFIX}hb.{m}"))?;
            if self.liveness.observe(m, beat, now, &mut liveness::probe) {
                tracing::warn!(
                    image = self.name,
                    gateway = me,
                    peer = m,
                    "a late peer's liveness port refused a connection: it is dead"
                );
            }
        }
        let holder = self.holder()?;
        let preferred = self
            .image
            .metadata(PREFERRED_KEY)?
            .and_then(|p| p.trim().parse::<u16>().ok());
        let alive = |m: u16| self.liveness.alive(m, now);
        let (mut owner, action) = decide(self.group, holder, &alive, preferred);
        match action {
            Action::Wait => {}
            Action::Acquire | Action::TakeOver => {
                // The view says transitioning while the lock moves.
                self.alua
                    .set(AluaView::owned_by(self.group.members.clone(), None));
                if action == Action::TakeOver {
                    for o in self.image.lock_owners()? {
                        tracing::warn!(
                            image = self.name,
                            gateway = me,
                            owner = ?holder,
                            client = %o,
                            "the owner is dead: breaking its lock (it is blocklisted)"
                        );
                        self.image.lock_break(&o)?;
                    }
                    // The blocklist is an OSD map change: until every OSD
                    // this client talks to has it, the old owner's writes
                    // already on their way could still land after ours
                    // (what ceph-nvmeof waits for too before it reports
                    // optimized). The reservation path waits the same way.
                    self.image.wait_for_latest_osdmap()?;
                }
                match self.image.lock_acquire() {
                    Ok(()) => {
                        self.image
                            .set_xattr(self.object, OWNER, me.to_string().as_bytes())?;
                        tracing::info!(
                            image = self.name,
                            gateway = me,
                            "this gateway owns the LU (active/optimized)"
                        );
                        owner = Some(me);
                    }
                    // Another gateway was quicker: it holds the lock now.
                    Err(e) => tracing::warn!(
                        image = self.name,
                        gateway = me,
                        error = %e,
                        "taking the lock failed"
                    ),
                }
            }
        }
        self.alua
            .set(AluaView::owned_by(self.group.members.clone(), owner));
        Ok(())
    }

    fn holder(&self) -> io::Result<Holder> {
        if self.image.is_lock_owner()? {
            return Ok(Holder::Me);
        }
        if self.image.lock_owners()?.is_empty() {
            return Ok(Holder::Nobody);
        }
        let port = self
            .image
            .xattr(self.object, OWNER)?
            .and_then(|b| String::from_utf8(b).ok()?.trim().parse::<u16>().ok())
            .filter(|p| self.group.members.contains(p));
        Ok(Holder::Other(port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(me: u16) -> GatewayGroup {
        GatewayGroup::new(me, [1, 2, 3])
    }

    #[test]
    fn a_live_owner_keeps_the_lu() {
        let all = |_| true;
        for me in [1, 2, 3] {
            assert_eq!(
                decide(&group(me), Holder::Other(Some(3)), &all, Some(1)).0,
                if me == 3 { None } else { Some(3) }
            );
        }
        assert_eq!(
            decide(&group(3), Holder::Me, &all, Some(1)),
            (Some(3), Action::Wait)
        );
    }

    #[test]
    fn a_dead_owner_is_taken_over_by_the_lowest_live_other() {
        let alive = |m| m != 1;
        assert_eq!(
            decide(&group(2), Holder::Other(Some(1)), &alive, None),
            (None, Action::TakeOver)
        );
        assert_eq!(
            decide(&group(3), Holder::Other(Some(1)), &alive, None),
            (None, Action::Wait)
        );
        // The preferred one, if alive, even if not the lowest.
        assert_eq!(
            decide(&group(3), Holder::Other(Some(1)), &alive, Some(3)),
            (None, Action::TakeOver)
        );
    }

    #[test]
    fn a_restarted_owner_takes_back_its_former_selfs_lock() {
        let all = |_| true;
        assert_eq!(
            decide(&group(1), Holder::Other(Some(1)), &all, None),
            (None, Action::TakeOver)
        );
        assert_eq!(
            decide(&group(2), Holder::Other(Some(1)), &all, None),
            (Some(1), Action::Wait)
        );
    }

    #[test]
    fn a_free_lock_goes_to_the_preferred_else_the_lowest_live() {
        let all = |_| true;
        assert_eq!(
            decide(&group(1), Holder::Nobody, &all, None).1,
            Action::Acquire
        );
        assert_eq!(
            decide(&group(2), Holder::Nobody, &all, None).1,
            Action::Wait
        );
        assert_eq!(
            decide(&group(2), Holder::Nobody, &all, Some(2)).1,
            Action::Acquire
        );
        assert_eq!(
            decide(&group(1), Holder::Nobody, &all, Some(2)).1,
            Action::Wait
        );
        let not_1 = |m| m != 1;
        assert_eq!(
            decide(&group(2), Holder::Nobody, &not_1, Some(1)).1,
            Action::Acquire
        );
    }
}
