//! NOP-In pings of an idle connection (RFC 7143 section 11.19): a
//! connection the initiator has been silent on for an interval is pinged
//! (a NOP-In asking for a NOP-Out); if it stays silent for another
//! interval, it is dropped. Anything the initiator sends counts as an
//! answer.
//!
//! ```text
//!   heard ──── interval ────▶ ping ──── interval ────▶ drop
//!     ▲ any PDU starts over      (silent)                 (still silent)
//! ```
//!
//! Time is an argument: the driver arms one timer at
//! [`Keepalive::deadline`] and reports it with [`Keepalive::timer_fired`];
//! a PDU only notes the time ([`Keepalive::heard`]) rather than re-arm a
//! timer per PDU.

use std::time::{Duration, Instant};

/// What the connection does when its keepalive timer fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeepaliveAction {
    /// The initiator was heard from since the timer was set: set it again
    /// for this moment.
    Rearm(Instant),
    /// Send a NOP-In ping, then report it with [`Keepalive::pinged`].
    Ping,
    /// The ping went unanswered: drop the connection.
    Drop,
}

/// The keepalive state of one connection.
#[derive(Clone, Debug)]
pub struct Keepalive {
    /// `None`: no pings (the connection may stay silent for ever).
    interval: Option<Duration>,
    /// When the initiator was last heard from, or the last ping went out.
    quiet_since: Instant,
    ping_outstanding: bool,
}

impl Keepalive {
    /// A connection that starts at `now`, pinged after `interval` of
    /// silence (`None`: never).
    pub fn new(interval: Option<Duration>, now: Instant) -> Self {
        Keepalive {
            interval,
            quiet_since: now,
            ping_outstanding: false,
        }
    }

    /// When the timer is next due (`None`: no pings, no timer).
    pub fn deadline(&self) -> Option<Instant> {
        Some(self.quiet_since + self.interval?)
    }

    /// A PDU arrived at `now`: the connection is alive.
    pub fn heard(&mut self, now: Instant) {
        self.quiet_since = now;
        self.ping_outstanding = false;
    }

    /// The timer set for [`deadline`](Self::deadline) fired at `now`.
    pub fn timer_fired(&self, now: Instant) -> KeepaliveAction {
        let Some(due) = self.deadline() else {
            // No pings: a timer that should not exist; keep it far away.
            return KeepaliveAction::Rearm(now + Duration::from_secs(86_400));
        };
        if due > now {
            KeepaliveAction::Rearm(due)
        } else if self.ping_outstanding {
            KeepaliveAction::Drop
        } else {
            KeepaliveAction::Ping
        }
    }

    /// The ping went out at `now`: returns when the timer is next due (if
    /// nothing is heard by then, the connection is dropped).
    pub fn pinged(&mut self, now: Instant) -> Option<Instant> {
        self.ping_outstanding = true;
        self.quiet_since = now;
        self.deadline()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn a_silent_connection_is_pinged_then_dropped() {
        let start = Instant::now();
        let mut keepalive = Keepalive::new(Some(5 * SECOND), start);
        assert_eq!(keepalive.deadline(), Some(start + 5 * SECOND));
        let at = start + 5 * SECOND;
        assert_eq!(keepalive.timer_fired(at), KeepaliveAction::Ping);
        assert_eq!(keepalive.pinged(at), Some(at + 5 * SECOND));
        assert_eq!(
            keepalive.timer_fired(at + 5 * SECOND),
            KeepaliveAction::Drop
        );
    }

    #[test]
    fn anything_heard_starts_over_and_answers_the_ping() {
        let start = Instant::now();
        let mut keepalive = Keepalive::new(Some(5 * SECOND), start);
        keepalive.heard(start + 3 * SECOND);
        // The timer set at the start fires early: set it again.
        assert_eq!(
            keepalive.timer_fired(start + 5 * SECOND),
            KeepaliveAction::Rearm(start + 8 * SECOND)
        );
        let at = start + 8 * SECOND;
        assert_eq!(keepalive.timer_fired(at), KeepaliveAction::Ping);
        keepalive.pinged(at);
        keepalive.heard(at + SECOND);
        assert_eq!(
            keepalive.timer_fired(at + 6 * SECOND),
            KeepaliveAction::Ping,
            "the answer cleared the ping"
        );
    }

    #[test]
    fn without_an_interval_nothing_is_ever_due() {
        let start = Instant::now();
        let keepalive = Keepalive::new(None, start);
        assert_eq!(keepalive.deadline(), None);
        assert!(matches!(
            keepalive.timer_fired(start + 1000 * SECOND),
            KeepaliveAction::Rearm(_)
        ));
    }
}
