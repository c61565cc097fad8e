//! What a gateway does once it learns that its RADOS client of an LU was
//! blocklisted: by another gateway of its group that took the LU over
//! (`gateway.rs`), or by a reservation change it did not acknowledge in
//! time (`pr.rs`). It hears it from its keeper, its reservation watch or an
//! I/O that failed with EBLOCKLISTED.
//!
//! Fenced, it serves no data I/O of the LU through that client: in a group
//! its port reports unavailable (every command but INQUIRY, REPORT LUNS,
//! REQUEST SENSE and REPORT TARGET PORT GROUPS ends in NOT READY, 04h/0Ch),
//! outside one every I/O ends in NOT READY, LOGICAL UNIT COMMUNICATION
//! FAILURE; and it says why in its log once, instead of failing every
//! command with an I/O error nobody can explain.
//!
//! A blocklisted client stays so (Ceph keeps the entry for an hour), so
//! the store connects a new client and rejoins with it (`mod.rs`,
//! `Shared::rejoin`). Each client has a generation; the fence stops every
//! client but the current one, so an I/O planned on the fenced client
//! (its [`super::RbdAsync`] was taken before the new one came) fails
//! rather than reach the new client, and a late error from the old one
//! trips nothing.
//!
//! A host should not see the fence as an I/O error: a rejoin takes about
//! a second. So an I/O refused by the fence, or failed by the
//! blocklist, fails with EAGAIN ([`std::io::ErrorKind::WouldBlock`]) for
//! [`REJOIN_GRACE`] after the trip, which the SCSI layer answers with BUSY
//! status (Linux's SCSI midlayer and QEMU send the command again; a NOT
//! READY would fail the I/O up to the application). A READ or WRITE
//! waits before that answer until the rejoin is done, [`HOLD_AT_MOST`] at
//! most, so that the first retry succeeds: QEMU gives up after five
//! retries spread at random over about 2.7 s. It waits outside the store
//! and holding nothing of the LU (`AsyncIo::ready`): the rejoin itself
//! waits for the LU's writes in flight. Those are store writes only, each
//! ended at once by the blocklist or by the RADOS op timeout (`timeout=`,
//! [`super::DEFAULT_TIMEOUT_S`]): that is the bound on a rejoin's wait. A
//! write still waiting for its Data-Out holds nothing of the LU (it takes
//! write access once all its data is in), so no initiator can hold a
//! rejoin (`tests/rbd.rs`,
//! `a_write_waiting_for_its_data_does_not_hold_a_rejoin`). Sent again, it is
//! checked again (reservations, ALUA) against what the rejoin brought,
//! and runs through the new client. A rejoin that takes longer (the
//! cluster unreachable) gets the lasting answer: NOT READY, LOGICAL UNIT
//! COMMUNICATION FAILURE, so that initiators fail over or give up rather
//! than retry for minutes.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::ffi::rados::EBLOCKLISTED;
use iscsi_scsi::alua::{AccessState, AluaGroup, AluaView, PortGroup};

/// How long after the fence tripped its refusals say "again soon" (BUSY):
/// a rejoin takes about a second; one that is not done by then is waiting
/// for a cluster it cannot reach.
pub(super) const REJOIN_GRACE: Duration = Duration::from_secs(10);

/// How long a command the fence refused waits for the rejoin before its
/// BUSY goes out ([`Fence::rejoined_within`]).
pub(super) const HOLD_AT_MOST: Duration = Duration::from_secs(5);

/// What an I/O refused while a rejoin is expected fails with (EAGAIN).
const EAGAIN: i32 = 11;

/// One LU's fence (see the module's doc).
#[derive(Debug)]
pub(super) struct Fence {
    /// This gateway's port in its group (the log's name for it).
    port: u16,
    name: String,
    /// The LU's ALUA view, in a gateway group.
    alua: Option<Arc<AluaGroup>>,
    /// The generation of the client that may serve.
    generation: AtomicU64,
    tripped: AtomicBool,
    /// When it last tripped: refusals say "again soon" for
    /// [`REJOIN_GRACE`] after it.
    tripped_at: Mutex<Option<Instant>>,
}

impl Fence {
    pub fn new(port: u16, name: String, alua: Option<Arc<AluaGroup>>) -> Self {
        Self {
            port,
            name,
            alua,
            generation: AtomicU64::new(0),
            tripped: AtomicBool::new(false),
            tripped_at: Mutex::new(None),
        }
    }

    /// The current client's generation.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether the client of generation `generation` may serve: it is the
    /// current one and not fenced.
    pub fn serving(&self, generation: u64) -> bool {
        !self.tripped() && self.generation() == generation
    }

    /// `Ok` if the client of `generation` may serve, else the error of an
    /// I/O the fence stops ([`Fence::refusal`]).
    pub fn admit(&self, generation: u64) -> io::Result<()> {
        if self.serving(generation) {
            Ok(())
        } else {
            Err(self.refusal(generation, Instant::now()))
        }
    }

    /// Passes `e` on, tripping the fence first if it says the current
    /// client (of generation `generation`) was blocklisted.
    pub fn check(&self, generation: u64, e: io::Error) -> io::Error {
        if e.raw_os_error() == Some(EBLOCKLISTED) {
            self.trip(generation);
        }
        e
    }

    /// [`Fence::check`] for a data I/O's error: a blocklisted one's is the
    /// fence's refusal, as for one the fence stopped before it started.
    /// (The reservation record's errors stay EBLOCKLISTED: the SCSI layer
    /// marks its reservation state stale on that.)
    pub fn check_io(&self, generation: u64, e: io::Error) -> io::Error {
        let e = self.check(generation, e);
        if e.raw_os_error() == Some(EBLOCKLISTED) {
            return self.refusal(generation, Instant::now());
        }
        e
    }

    /// Returns once the fence is open again (the rejoin done), at most
    /// `at_most` from now: what a command refused with "again soon" waits
    /// for before its BUSY goes out, so that the initiator's first retry
    /// finds the new client (QEMU retries BUSY five times over about 2.7 s
    /// in all, at random; Linux's midlayer every few milliseconds).
    pub async fn rejoined_within(&self, at_most: Duration) {
        let until = tokio::time::Instant::now() + at_most;
        while self.tripped() && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The error of an I/O of the client of `generation` that the fence
    /// stops at `now`: EAGAIN (BUSY: sent again, it goes through the
    /// current client) when that client was replaced already, or the fence
    /// tripped less than [`REJOIN_GRACE`] ago; else EBLOCKLISTED (NOT
    /// READY, LOGICAL UNIT COMMUNICATION FAILURE).
    fn refusal(&self, generation: u64, now: Instant) -> io::Error {
        let replaced = generation < self.generation();
        let tripped_at = *self
            .tripped_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let rejoining = self.tripped()
            && tripped_at.is_some_and(|at| now.saturating_duration_since(at) < REJOIN_GRACE);
        io::Error::from_raw_os_error(if replaced || rejoining {
            EAGAIN
        } else {
            EBLOCKLISTED
        })
    }

    /// Whether the fence has tripped.
    pub fn tripped(&self) -> bool {
        self.tripped.load(Ordering::Acquire)
    }

    /// Trips the fence if `generation` is the current client's.
    pub fn trip(&self, generation: u64) {
        if self.generation() != generation || self.tripped.load(Ordering::Acquire) {
            return;
        }
        // The time first: whoever sees `tripped` finds it.
        *self
            .tripped_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        if self.tripped.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.port;
        match &self.alua {
            Some(alua) => {
                tracing::error!(
                    "{}: gateway {me} was blocklisted by another gateway of its group (the LU \
                     moved there, or a reservation change went on without it); its port reports \
                     unavailable until it has rejoined with a new client",
                    self.name
                );
                let view = alua.view();
                alua.set(AluaView::new(view.groups().iter().map(|g| PortGroup {
                    id: g.id,
                    state: if g.id == me {
                        AccessState::Unavailable
                    } else {
                        g.state
                    },
                })));
            }
            None => tracing::error!(
                "{}: this gateway's client was blocklisted by another gateway (a reservation \
                 change went on without it); every I/O fails until it has rejoined with a new \
                 client",
                self.name
            ),
        }
    }

    /// The client of generation `generation` (the one after the fenced
    /// one) serves from now on.
    pub fn rejoined(&self, generation: u64) {
        self.generation.store(generation, Ordering::Release);
        self.tripped.store(false, Ordering::Release);
        tracing::warn!(
            "{}: rejoined with a new client: serving again{}",
            self.name,
            if self.alua.is_some() {
                " (the port's state is the group's again)"
            } else {
                ""
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_current_clients_error_trips_and_only_it_serves() {
        let f = Fence::new(1, "rbd:p/i".into(), None);
        assert!(f.serving(0));
        // An error of an older client trips nothing.
        let _ = f.check(7, io::Error::from_raw_os_error(EBLOCKLISTED));
        assert!(f.serving(0));
        // Nor does another error of the current one.
        let _ = f.check(0, io::Error::from_raw_os_error(5));
        assert!(f.serving(0));
        let refused = f.check_io(0, io::Error::from_raw_os_error(EBLOCKLISTED));
        assert!(f.tripped() && !f.serving(0));
        // Refused while a rejoin is expected: "again soon".
        assert_eq!(refused.raw_os_error(), Some(EAGAIN));
        assert_eq!(refused.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(f.admit(0).unwrap_err().raw_os_error(), Some(EAGAIN));
        f.rejoined(1);
        assert!(f.serving(1) && !f.serving(0));
        // An I/O planned on the replaced client is sent again through the
        // new one.
        assert_eq!(f.admit(0).unwrap_err().raw_os_error(), Some(EAGAIN));
        assert!(f.admit(1).is_ok());
        // The fenced client's late error does not trip the new one.
        let _ = f.check_io(0, io::Error::from_raw_os_error(EBLOCKLISTED));
        assert!(f.serving(1));
        // The reservation record's errors go on as they are.
        let record = f.check(1, io::Error::from_raw_os_error(EBLOCKLISTED));
        assert_eq!(record.raw_os_error(), Some(EBLOCKLISTED));
        assert!(f.tripped());
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_command_waits_for_the_rejoin_at_most_the_bound() {
        let f = Arc::new(Fence::new(1, "rbd:p/i".into(), None));
        // Open: no wait.
        let start = tokio::time::Instant::now();
        f.rejoined_within(HOLD_AT_MOST).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        // Tripped and not rejoined: the whole bound.
        f.trip(0);
        f.rejoined_within(HOLD_AT_MOST).await;
        assert!(start.elapsed() >= HOLD_AT_MOST);
        // Rejoined 300 ms in: until then.
        let rejoin = Arc::clone(&f);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            rejoin.rejoined(1);
        });
        let start = tokio::time::Instant::now();
        f.rejoined_within(HOLD_AT_MOST).await;
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_millis(400),
            "{took:?}"
        );
    }

    #[test]
    fn a_rejoin_that_takes_past_the_grace_gets_the_lasting_answer() {
        let f = Fence::new(1, "rbd:p/i".into(), None);
        f.trip(0);
        let at = f.tripped_at.lock().unwrap().expect("tripped");
        let code = |after: Duration| f.refusal(0, at + after).raw_os_error();
        assert_eq!(code(Duration::ZERO), Some(EAGAIN));
        assert_eq!(code(REJOIN_GRACE - Duration::from_millis(1)), Some(EAGAIN));
        assert_eq!(code(REJOIN_GRACE), Some(EBLOCKLISTED));
        // Rejoined and tripped again: the grace counts from the new trip.
        f.rejoined(1);
        f.trip(1);
        let again = f.tripped_at.lock().unwrap().expect("tripped");
        assert!(again >= at);
        assert_eq!(f.refusal(1, again).raw_os_error(), Some(EAGAIN));
    }

    #[test]
    fn in_a_group_a_trip_makes_the_port_unavailable() {
        let alua = Arc::new(AluaGroup::new(AluaView::owned_by(vec![1, 2], Some(1))));
        let f = Fence::new(1, "rbd:p/i".into(), Some(Arc::clone(&alua)));
        f.trip(0);
        assert_eq!(alua.state_of(1), AccessState::Unavailable);
        assert_eq!(alua.state_of(2), AccessState::Standby);
    }
}
