//! The connection and session state machines of RFC 7143 section 8, for
//! both roles, as pure transition functions: no I/O, no clocks. The I/O
//! drivers report what happened (a transport connected, a Login Response
//! went out, a Logout Request arrived, the transport dropped, a timer
//! fired) as an event; the machine answers with the RFC's transition label
//! and the next state, or refuses an event the RFC does not allow in the
//! current state, so a driver bug or a peer that breaks the sequence shows
//! up as an error rather than as a silently wrong state.
//!
//! - [`ConnectionStateMachine`]: section 8.1 (states S1-S8, transitions
//!   T1-T18; initiators have XPT_WAIT, targets XPT_UP) together with the
//!   connection cleanup diagram of section 8.2 (CLEANUP_WAIT, IN_CLEANUP,
//!   transitions M1-M5), which continues the same connection's life after
//!   T15/T16/T17.
//! - [`SessionStateMachine`]: section 8.3 (FREE, LOGGED_IN, FAILED for
//!   both roles; ACTIVE and IN_CONTINUE for targets only).
//!
//! The transition labels follow the RFC's text; where the text was not at
//! hand they were checked against the labels two independent
//! implementations cite in their own state machines (an initiator's and a
//! target's), so a trace reads the same as the RFC's diagrams.

use std::fmt;

/// Which side's diagram a machine follows: a few states and transitions
/// exist for one side only (sections 8.1.1 and 8.1.2). The same role type
/// as negotiation's.
pub use crate::text::Role;

/// A connection's state (RFC 7143 8.1.1 S1-S8 and 8.2 R1-R3; R1 is S8 and
/// R3 is S1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnectionState {
    /// S1 / R3 FREE: no transport connection, or it is being closed.
    Free,
    /// S2 XPT_WAIT (initiator only): a transport connection was requested.
    XptWait,
    /// S3 XPT_UP (target only): a transport connection is up, no Login yet.
    XptUp,
    /// S4 IN_LOGIN: the login phase is under way.
    InLogin,
    /// S5 LOGGED_IN: full feature phase.
    LoggedIn,
    /// S6 IN_LOGOUT: a Logout Request was sent (initiator) or received
    /// (target); the Logout Response is awaited or being prepared.
    InLogout,
    /// S7 LOGOUT_REQUESTED: the target asked for a logout with an
    /// Asynchronous Message (AsyncEvent 1).
    LogoutRequested,
    /// S8 / R1 CLEANUP_WAIT: the connection failed; its state waits for an
    /// implicit or explicit logout, or for a timeout.
    CleanupWait,
    /// R2 IN_CLEANUP: the cleanup logout (on another connection, or by
    /// connection reinstatement) is under way.
    InCleanup,
}

impl ConnectionState {
    /// The RFC's symbolic name.
    pub fn rfc_name(self) -> &'static str {
        match self {
            ConnectionState::Free => "FREE",
            ConnectionState::XptWait => "XPT_WAIT",
            ConnectionState::XptUp => "XPT_UP",
            ConnectionState::InLogin => "IN_LOGIN",
            ConnectionState::LoggedIn => "LOGGED_IN",
            ConnectionState::InLogout => "IN_LOGOUT",
            ConnectionState::LogoutRequested => "LOGOUT_REQUESTED",
            ConnectionState::CleanupWait => "CLEANUP_WAIT",
            ConnectionState::InCleanup => "IN_CLEANUP",
        }
    }

    /// Whether SCSI commands, task management and text requests may flow
    /// (LOGGED_IN, and LOGOUT_REQUESTED until the logout starts: section
    /// 11.9.1 gives the initiator time to finish its work).
    pub fn is_full_feature(self) -> bool {
        matches!(
            self,
            ConnectionState::LoggedIn | ConnectionState::LogoutRequested
        )
    }
}

impl fmt::Display for ConnectionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.rfc_name())
    }
}

/// What happened to a connection, as the I/O driver observed it. Each
/// event stands for the RFC's wording of one or more transitions (section
/// 8.1.3 and 8.2.2); the doc of each variant names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnectionEvent {
    /// Initiator: a transport connect request was made (T1).
    ConnectRequested,
    /// Initiator: the transport connection is established, the login
    /// starts (T4).
    Connected,
    /// Target: a valid transport connection request was accepted (T3).
    Accepted,
    /// Target: the first Login Request arrived (T4).
    LoginRequestReceived,
    /// The final Login Response with Status-Class 0 was received
    /// (initiator) or sent (target) (T5).
    LoginSucceeded,
    /// The final Login Response carried a non-zero Status-Class (T7 a).
    LoginFailed,
    /// No (complete) login within the allowed time (target T6, initiator
    /// T7 b; for the initiator's XPT_WAIT, the connect timed out, T2).
    LoginTimedOut,
    /// The transport dropped: disconnect indication, reset, or a transport
    /// timeout (T2, T6, T7, T15, T16, T17).
    TransportLost,
    /// A "close the session" Logout succeeded on another connection, or
    /// (target) a connection or session reinstatement replaced this
    /// connection: it closes without further cleanup (T2, T7, T8, T13, T18,
    /// M1, M5).
    SessionClosedElsewhere,
    /// A Logout Request for this connection or its session was sent
    /// (initiator) or received (target) on this connection (T9, T10).
    LogoutStarted,
    /// The target asked for a logout: an Asynchronous Message with
    /// AsyncEvent 1 received (initiator) or sent (target) (T11, T12, T14).
    LogoutRequestedByTarget,
    /// The Logout Response (success) was received (initiator) or sent
    /// (target) (T13).
    LogoutSucceeded,
    /// The logout failed: a Logout Response with a non-zero response
    /// (T17).
    LogoutFailed,
    /// The connection state timeout (Time2Wait + Time2Retain) expired
    /// during cleanup (M1, M5).
    CleanupTimedOut,
    /// An implicit (connection reinstatement) or explicit (Logout on
    /// another connection) logout for this CID started (M2).
    CleanupStarted,
    /// That cleanup logout failed (M3).
    CleanupFailed,
    /// That cleanup logout succeeded (M4).
    CleanupSucceeded,
}

/// A transition the RFC allows: its label and the state it leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition<S> {
    /// The RFC's label: "T1".."T18", "M1".."M5", "N1".."N11" ("-" for an
    /// event that keeps the session's state, such as a further MC/S
    /// connection logging in).
    pub label: &'static str,
    /// The state before.
    pub from: S,
    /// The state after.
    pub to: S,
}

/// An event the RFC's diagram has no transition for in the current state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{role:?} {machine}: no transition for {event} in state {state}")]
pub struct IllegalTransition {
    /// Which side's diagram.
    pub role: Role,
    /// "connection" or "session".
    pub machine: &'static str,
    /// The state the machine was (and stays) in, by its RFC name.
    pub state: &'static str,
    /// The event.
    pub event: String,
}

/// One of section 8's diagrams: its states, its events and its
/// transition function.
pub trait Diagram {
    /// The diagram's states.
    type State: Copy + fmt::Debug + fmt::Display + PartialEq;
    /// What the drivers report.
    type Event: Copy + fmt::Debug;
    /// "connection" or "session", for errors.
    const NAME: &'static str;
    /// Where every machine starts (FREE).
    const INITIAL: Self::State;
    /// The transition for `event` in `state` for `role`, if any.
    fn transition(
        role: Role,
        state: Self::State,
        event: Self::Event,
    ) -> Option<Transition<Self::State>>;
    /// The RFC's name of a state.
    fn state_name(state: Self::State) -> &'static str;
}

/// A state machine following diagram `D` for one role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine<D: Diagram> {
    role: Role,
    state: D::State,
}

impl<D: Diagram> Machine<D> {
    /// A machine for `role` in the diagram's initial state (FREE).
    pub fn new(role: Role) -> Self {
        Machine::in_state(role, D::INITIAL)
    }

    /// A machine for `role` already in `state`.
    pub fn in_state(role: Role, state: D::State) -> Self {
        Machine { role, state }
    }

    /// The current state.
    pub fn state(&self) -> D::State {
        self.state
    }

    /// Applies `event`: the transition taken, or an error (the state is
    /// then unchanged).
    pub fn handle(&mut self, event: D::Event) -> Result<Transition<D::State>, IllegalTransition> {
        let transition =
            D::transition(self.role, self.state, event).ok_or_else(|| IllegalTransition {
                role: self.role,
                machine: D::NAME,
                state: D::state_name(self.state),
                event: format!("{event:?}"),
            })?;
        self.state = transition.to;
        Ok(transition)
    }
}

/// Section 8.1 with 8.2: a connection's diagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionDiagram;

impl Diagram for ConnectionDiagram {
    type State = ConnectionState;
    type Event = ConnectionEvent;
    const NAME: &'static str = "connection";
    const INITIAL: ConnectionState = ConnectionState::Free;
    fn transition(
        role: Role,
        state: ConnectionState,
        event: ConnectionEvent,
    ) -> Option<Transition<ConnectionState>> {
        connection_transition(role, state, event)
    }
    fn state_name(state: ConnectionState) -> &'static str {
        state.rfc_name()
    }
}

/// One connection's state machine (sections 8.1 and 8.2).
pub type ConnectionStateMachine = Machine<ConnectionDiagram>;

/// The transition for `event` in `state` for `role`, if the RFC has one
/// (sections 8.1.3 and 8.2.2).
pub fn connection_transition(
    role: Role,
    state: ConnectionState,
    event: ConnectionEvent,
) -> Option<Transition<ConnectionState>> {
    use ConnectionEvent as E;
    use ConnectionState as S;
    let initiator = role == Role::Initiator;
    let (label, to) = match (state, event) {
        // Establishing the transport (initiator T1, T2, T4; target T3,
        // T6, T4).
        (S::Free, E::ConnectRequested) if initiator => ("T1", S::XptWait),
        (S::XptWait, E::TransportLost | E::LoginTimedOut | E::SessionClosedElsewhere)
            if initiator =>
        {
            ("T2", S::Free)
        }
        (S::XptWait, E::Connected) if initiator => ("T4", S::InLogin),
        (S::Free, E::Accepted) if !initiator => ("T3", S::XptUp),
        (S::XptUp, E::LoginTimedOut | E::TransportLost) if !initiator => ("T6", S::Free),
        (S::XptUp, E::LoginRequestReceived) if !initiator => ("T4", S::InLogin),
        // The login phase (T5, T7).
        (S::InLogin, E::LoginSucceeded) => ("T5", S::LoggedIn),
        (
            S::InLogin,
            E::LoginFailed | E::LoginTimedOut | E::TransportLost | E::SessionClosedElsewhere,
        ) => ("T7", S::Free),
        // Full feature phase and logout (T8-T18).
        (S::LoggedIn, E::SessionClosedElsewhere) => ("T8", S::Free),
        (S::LoggedIn, E::LogoutStarted) => ("T9", S::InLogout),
        (S::LogoutRequested, E::LogoutStarted) => ("T10", S::InLogout),
        (S::LoggedIn, E::LogoutRequestedByTarget) => ("T11", S::LogoutRequested),
        (S::LogoutRequested, E::LogoutRequestedByTarget) => ("T12", S::LogoutRequested),
        (S::InLogout, E::LogoutSucceeded | E::SessionClosedElsewhere) => ("T13", S::Free),
        (S::InLogout, E::LogoutRequestedByTarget) => ("T14", S::InLogout),
        (S::LoggedIn, E::TransportLost) => ("T15", S::CleanupWait),
        (S::LogoutRequested, E::TransportLost) => ("T16", S::CleanupWait),
        (S::InLogout, E::TransportLost | E::LogoutFailed) => ("T17", S::CleanupWait),
        (S::LogoutRequested, E::SessionClosedElsewhere) => ("T18", S::Free),
        // Connection cleanup (section 8.2, M1-M5).
        (S::CleanupWait, E::CleanupTimedOut | E::SessionClosedElsewhere) => ("M1", S::Free),
        (S::CleanupWait, E::CleanupStarted) => ("M2", S::InCleanup),
        (S::InCleanup, E::CleanupFailed) => ("M3", S::CleanupWait),
        (S::InCleanup, E::CleanupSucceeded) => ("M4", S::Free),
        (S::InCleanup, E::CleanupTimedOut | E::SessionClosedElsewhere) => ("M5", S::Free),
        _ => return None,
    };
    Some(Transition {
        label,
        from: state,
        to,
    })
}

/// A session's state (RFC 7143 8.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionState {
    /// Q1 FREE: no session, or it is being torn down.
    Free,
    /// Q2 ACTIVE (target only): the leading connection's login is under
    /// way.
    Active,
    /// Q3 LOGGED_IN: at least one connection is in full feature phase.
    LoggedIn,
    /// Q4 FAILED: every connection failed; the session waits for
    /// continuation, reinstatement or its timeout.
    Failed,
    /// Q5 IN_CONTINUE (target only): a continuation attempt (a login into
    /// the failed session) is under way.
    InContinue,
}

impl SessionState {
    /// The RFC's symbolic name.
    pub fn rfc_name(self) -> &'static str {
        match self {
            SessionState::Free => "FREE",
            SessionState::Active => "ACTIVE",
            SessionState::LoggedIn => "LOGGED_IN",
            SessionState::Failed => "FAILED",
            SessionState::InContinue => "IN_CONTINUE",
        }
    }
}

impl fmt::Display for SessionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.rfc_name())
    }
}

/// What happened to a session (section 8.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionEvent {
    /// Target: the first Login Request of the leading connection arrived.
    LeadingLoginStarted,
    /// A connection of the session reached LOGGED_IN: the leading login
    /// finished, or a continuation attempt succeeded.
    ConnectionLoggedIn,
    /// Target: the leading connection's login failed.
    LeadingLoginFailed,
    /// Session closure (section 6.3.6): a successful "close the session"
    /// logout, or the last connection's successful "close the connection"
    /// logout with nothing waiting for cleanup.
    Closed,
    /// Session failure: the last connection left full feature phase other
    /// than by a logout (it failed, or went to CLEANUP_WAIT).
    Failed,
    /// Target: a login into the failed session (continuation) started.
    ContinuationStarted,
    /// Target: the last continuation attempt failed.
    ContinuationFailed,
    /// The session state timeout (Time2Wait + Time2Retain) expired, or a
    /// session reinstatement (same initiator and ISID, TSIH 0) cleared
    /// this session: a failed one (N6) or, on a target, one still in its
    /// leading login or in a continuation attempt (N11).
    TimedOutOrReinstated,
}

/// The transition for `event` in `state` for `role`, if section 8.3 has
/// one.
pub fn session_transition(
    role: Role,
    state: SessionState,
    event: SessionEvent,
) -> Option<Transition<SessionState>> {
    use SessionEvent as E;
    use SessionState as S;
    let target = role == Role::Target;
    let (label, to) = match (state, event) {
        (S::Free, E::ConnectionLoggedIn) if !target => ("N1", S::LoggedIn),
        (S::Free, E::LeadingLoginStarted) if target => ("N1", S::Active),
        (S::Active, E::ConnectionLoggedIn) if target => ("N2", S::LoggedIn),
        // A further connection joining a logged-in session (MC/S) does not
        // change the session's state.
        (S::LoggedIn, E::ConnectionLoggedIn) => ("-", S::LoggedIn),
        (S::LoggedIn, E::Closed) => ("N3", S::Free),
        (S::Failed, E::ConnectionLoggedIn) if !target => ("N4", S::LoggedIn),
        (S::InContinue, E::ConnectionLoggedIn) if target => ("N10", S::LoggedIn),
        (S::LoggedIn, E::Failed) => ("N5", S::Failed),
        (S::Failed, E::TimedOutOrReinstated) => ("N6", S::Free),
        (S::Failed, E::ContinuationStarted) if target => ("N7", S::InContinue),
        (S::InContinue, E::ContinuationFailed) if target => ("N8", S::Failed),
        (S::Active, E::LeadingLoginFailed) if target => ("N9", S::Free),
        (S::Active | S::InContinue, E::TimedOutOrReinstated) if target => ("N11", S::Free),
        _ => return None,
    };
    Some(Transition {
        label,
        from: state,
        to,
    })
}

/// Section 8.3: a session's diagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionDiagram;

impl Diagram for SessionDiagram {
    type State = SessionState;
    type Event = SessionEvent;
    const NAME: &'static str = "session";
    const INITIAL: SessionState = SessionState::Free;
    fn transition(
        role: Role,
        state: SessionState,
        event: SessionEvent,
    ) -> Option<Transition<SessionState>> {
        session_transition(role, state, event)
    }
    fn state_name(state: SessionState) -> &'static str {
        state.rfc_name()
    }
}

/// One session's state machine (section 8.3).
pub type SessionStateMachine = Machine<SessionDiagram>;

#[cfg(test)]
mod tests;
