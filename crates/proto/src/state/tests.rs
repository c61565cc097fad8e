//! One row per transition of RFC 7143 section 8 (both roles), and a sweep
//! over every (role, state, event) that checks nothing outside the table
//! is accepted.

use super::*;
use ConnectionEvent as E;
use ConnectionState as S;
use Role::{Initiator as I, Target as T};

const CONNECTION_STATES: [ConnectionState; 9] = [
    S::Free,
    S::XptWait,
    S::XptUp,
    S::InLogin,
    S::LoggedIn,
    S::InLogout,
    S::LogoutRequested,
    S::CleanupWait,
    S::InCleanup,
];

const CONNECTION_EVENTS: [ConnectionEvent; 17] = [
    E::ConnectRequested,
    E::Connected,
    E::Accepted,
    E::LoginRequestReceived,
    E::LoginSucceeded,
    E::LoginFailed,
    E::LoginTimedOut,
    E::TransportLost,
    E::SessionClosedElsewhere,
    E::LogoutStarted,
    E::LogoutRequestedByTarget,
    E::LogoutSucceeded,
    E::LogoutFailed,
    E::CleanupTimedOut,
    E::CleanupStarted,
    E::CleanupFailed,
    E::CleanupSucceeded,
];

/// (role, from, event, label, to): the RFC's transitions, each with the
/// events that stand for its wording in section 8.1.3 / 8.2.2.
#[rustfmt::skip]
const CONNECTION_TABLE: &[(Role, ConnectionState, ConnectionEvent, &str, ConnectionState)] = &[
    // T1: initiator made a transport connect request.
    (I, S::Free, E::ConnectRequested, "T1", S::XptWait),
    // T2: connect timed out, transport reset, or the session was closed
    // by a logout on another connection.
    (I, S::XptWait, E::TransportLost, "T2", S::Free),
    (I, S::XptWait, E::LoginTimedOut, "T2", S::Free),
    (I, S::XptWait, E::SessionClosedElsewhere, "T2", S::Free),
    // T3: target accepted a transport connection.
    (T, S::Free, E::Accepted, "T3", S::XptUp),
    // T4: initiator's transport is up / target got the first Login.
    (I, S::XptWait, E::Connected, "T4", S::InLogin),
    (T, S::XptUp, E::LoginRequestReceived, "T4", S::InLogin),
    // T5: final Login Response with Status-Class 0.
    (I, S::InLogin, E::LoginSucceeded, "T5", S::LoggedIn),
    (T, S::InLogin, E::LoginSucceeded, "T5", S::LoggedIn),
    // T6: target: no login in time, or the transport went away.
    (T, S::XptUp, E::LoginTimedOut, "T6", S::Free),
    (T, S::XptUp, E::TransportLost, "T6", S::Free),
    // T7: the login failed, timed out, or lost its transport.
    (I, S::InLogin, E::LoginFailed, "T7", S::Free),
    (I, S::InLogin, E::LoginTimedOut, "T7", S::Free),
    (I, S::InLogin, E::TransportLost, "T7", S::Free),
    (I, S::InLogin, E::SessionClosedElsewhere, "T7", S::Free),
    (T, S::InLogin, E::LoginFailed, "T7", S::Free),
    (T, S::InLogin, E::LoginTimedOut, "T7", S::Free),
    (T, S::InLogin, E::TransportLost, "T7", S::Free),
    (T, S::InLogin, E::SessionClosedElsewhere, "T7", S::Free),
    // T8: closed cleanly by a session close elsewhere (or, target, a
    // reinstatement).
    (I, S::LoggedIn, E::SessionClosedElsewhere, "T8", S::Free),
    (T, S::LoggedIn, E::SessionClosedElsewhere, "T8", S::Free),
    // T9, T10: Logout Request sent / received.
    (I, S::LoggedIn, E::LogoutStarted, "T9", S::InLogout),
    (T, S::LoggedIn, E::LogoutStarted, "T9", S::InLogout),
    (I, S::LogoutRequested, E::LogoutStarted, "T10", S::InLogout),
    (T, S::LogoutRequested, E::LogoutStarted, "T10", S::InLogout),
    // T11, T12, T14: the target's Asynchronous Message asking for a
    // logout (first time, again, again during the logout).
    (I, S::LoggedIn, E::LogoutRequestedByTarget, "T11", S::LogoutRequested),
    (T, S::LoggedIn, E::LogoutRequestedByTarget, "T11", S::LogoutRequested),
    (I, S::LogoutRequested, E::LogoutRequestedByTarget, "T12", S::LogoutRequested),
    (T, S::LogoutRequested, E::LogoutRequestedByTarget, "T12", S::LogoutRequested),
    (I, S::InLogout, E::LogoutRequestedByTarget, "T14", S::InLogout),
    (T, S::InLogout, E::LogoutRequestedByTarget, "T14", S::InLogout),
    // T13: the logout succeeded (or the session closed elsewhere).
    (I, S::InLogout, E::LogoutSucceeded, "T13", S::Free),
    (T, S::InLogout, E::LogoutSucceeded, "T13", S::Free),
    (I, S::InLogout, E::SessionClosedElsewhere, "T13", S::Free),
    (T, S::InLogout, E::SessionClosedElsewhere, "T13", S::Free),
    // T15, T16, T17: failures into CLEANUP_WAIT.
    (I, S::LoggedIn, E::TransportLost, "T15", S::CleanupWait),
    (T, S::LoggedIn, E::TransportLost, "T15", S::CleanupWait),
    (I, S::LogoutRequested, E::TransportLost, "T16", S::CleanupWait),
    (T, S::LogoutRequested, E::TransportLost, "T16", S::CleanupWait),
    (I, S::InLogout, E::TransportLost, "T17", S::CleanupWait),
    (T, S::InLogout, E::TransportLost, "T17", S::CleanupWait),
    (I, S::InLogout, E::LogoutFailed, "T17", S::CleanupWait),
    (T, S::InLogout, E::LogoutFailed, "T17", S::CleanupWait),
    // T18: asked to log out, but the session closed elsewhere.
    (I, S::LogoutRequested, E::SessionClosedElsewhere, "T18", S::Free),
    (T, S::LogoutRequested, E::SessionClosedElsewhere, "T18", S::Free),
    // M1-M5: connection cleanup (section 8.2), the same for both roles.
    (I, S::CleanupWait, E::CleanupTimedOut, "M1", S::Free),
    (T, S::CleanupWait, E::CleanupTimedOut, "M1", S::Free),
    (I, S::CleanupWait, E::SessionClosedElsewhere, "M1", S::Free),
    (T, S::CleanupWait, E::SessionClosedElsewhere, "M1", S::Free),
    (I, S::CleanupWait, E::CleanupStarted, "M2", S::InCleanup),
    (T, S::CleanupWait, E::CleanupStarted, "M2", S::InCleanup),
    (I, S::InCleanup, E::CleanupFailed, "M3", S::CleanupWait),
    (T, S::InCleanup, E::CleanupFailed, "M3", S::CleanupWait),
    (I, S::InCleanup, E::CleanupSucceeded, "M4", S::Free),
    (T, S::InCleanup, E::CleanupSucceeded, "M4", S::Free),
    (I, S::InCleanup, E::CleanupTimedOut, "M5", S::Free),
    (T, S::InCleanup, E::CleanupTimedOut, "M5", S::Free),
    (I, S::InCleanup, E::SessionClosedElsewhere, "M5", S::Free),
    (T, S::InCleanup, E::SessionClosedElsewhere, "M5", S::Free),
];

#[test]
fn every_connection_transition_of_the_rfc() {
    for &(role, from, event, label, to) in CONNECTION_TABLE {
        let got = connection_transition(role, from, event)
            .unwrap_or_else(|| panic!("{role:?} {from} {event:?} must be {label}"));
        assert_eq!(
            (got.label, got.from, got.to),
            (label, from, to),
            "{role:?} {from} {event:?}"
        );
        let mut machine = ConnectionStateMachine::in_state(role, from);
        assert_eq!(machine.handle(event).unwrap().to, to);
        assert_eq!(machine.state(), to);
    }
}

#[test]
fn nothing_outside_the_connection_table_is_accepted() {
    let mut accepted = 0;
    for role in [I, T] {
        for from in CONNECTION_STATES {
            for event in CONNECTION_EVENTS {
                let in_table = CONNECTION_TABLE
                    .iter()
                    .any(|&(r, f, e, _, _)| (r, f, e) == (role, from, event));
                let got = connection_transition(role, from, event);
                assert_eq!(
                    got.is_some(),
                    in_table,
                    "{role:?} {from} {event:?}: {got:?}"
                );
                if !in_table {
                    let mut machine = ConnectionStateMachine::in_state(role, from);
                    let error = machine.handle(event).unwrap_err();
                    assert_eq!(machine.state(), from, "a refused event leaves the state");
                    assert!(error.to_string().contains(from.rfc_name()), "{error}");
                } else {
                    accepted += 1;
                }
            }
        }
    }
    assert_eq!(accepted, CONNECTION_TABLE.len(), "no duplicate rows");
}

#[test]
fn every_label_t1_to_t18_and_m1_to_m5_is_reachable_for_its_roles() {
    let labels = |role: Role| -> Vec<&str> {
        CONNECTION_TABLE
            .iter()
            .filter(|row| row.0 == role)
            .map(|row| row.3)
            .collect()
    };
    let initiator = labels(I);
    let target = labels(T);
    for n in 1..=18 {
        let label = format!("T{n}");
        let in_initiator = initiator.contains(&label.as_str());
        let in_target = target.contains(&label.as_str());
        match n {
            // Initiator-only transitions (XPT_WAIT).
            1 | 2 => assert!(in_initiator && !in_target, "{label}"),
            // Target-only transitions (XPT_UP).
            3 | 6 => assert!(!in_initiator && in_target, "{label}"),
            _ => assert!(in_initiator && in_target, "{label}"),
        }
    }
    for n in 1..=5 {
        let label = format!("M{n}");
        assert!(initiator.contains(&label.as_str()) && target.contains(&label.as_str()));
    }
}

#[test]
fn a_target_connection_from_accept_to_logout() {
    let mut machine = ConnectionStateMachine::new(T);
    let path: Vec<&str> = [
        E::Accepted,
        E::LoginRequestReceived,
        E::LoginSucceeded,
        E::LogoutRequestedByTarget,
        E::LogoutStarted,
        E::LogoutSucceeded,
    ]
    .into_iter()
    .map(|event| machine.handle(event).unwrap().label)
    .collect();
    assert_eq!(path, ["T3", "T4", "T5", "T11", "T10", "T13"]);
    assert_eq!(machine.state(), S::Free);
    // A Login Request in full feature phase is not a transition.
    let mut machine = ConnectionStateMachine::new(T);
    for event in [E::Accepted, E::LoginRequestReceived, E::LoginSucceeded] {
        machine.handle(event).unwrap();
    }
    assert!(machine.state().is_full_feature());
    assert!(machine.handle(E::LoginRequestReceived).is_err());
    assert!(machine.handle(E::ConnectRequested).is_err());
}

#[test]
fn an_initiator_connection_that_fails_and_is_cleaned_up_by_reinstatement() {
    let mut machine = ConnectionStateMachine::new(I);
    let labels: Vec<&str> = [
        E::ConnectRequested,
        E::Connected,
        E::LoginSucceeded,
        E::TransportLost,
        E::CleanupStarted,
        E::CleanupFailed,
        E::CleanupStarted,
        E::CleanupSucceeded,
    ]
    .into_iter()
    .map(|event| machine.handle(event).unwrap().label)
    .collect();
    assert_eq!(labels, ["T1", "T4", "T5", "T15", "M2", "M3", "M2", "M4"]);
    assert_eq!(machine.state(), S::Free);
}

const SESSION_STATES: [SessionState; 5] = [
    SessionState::Free,
    SessionState::Active,
    SessionState::LoggedIn,
    SessionState::Failed,
    SessionState::InContinue,
];

const SESSION_EVENTS: [SessionEvent; 8] = [
    SessionEvent::LeadingLoginStarted,
    SessionEvent::ConnectionLoggedIn,
    SessionEvent::LeadingLoginFailed,
    SessionEvent::Closed,
    SessionEvent::Failed,
    SessionEvent::ContinuationStarted,
    SessionEvent::ContinuationFailed,
    SessionEvent::TimedOutOrReinstated,
];

/// (role, from, event, label, to) for section 8.3.
#[rustfmt::skip]
const SESSION_TABLE: &[(Role, SessionState, SessionEvent, &str, SessionState)] = &[
    (I, SessionState::Free, SessionEvent::ConnectionLoggedIn, "N1", SessionState::LoggedIn),
    (T, SessionState::Free, SessionEvent::LeadingLoginStarted, "N1", SessionState::Active),
    (T, SessionState::Active, SessionEvent::ConnectionLoggedIn, "N2", SessionState::LoggedIn),
    (I, SessionState::LoggedIn, SessionEvent::ConnectionLoggedIn, "-", SessionState::LoggedIn),
    (T, SessionState::LoggedIn, SessionEvent::ConnectionLoggedIn, "-", SessionState::LoggedIn),
    (I, SessionState::LoggedIn, SessionEvent::Closed, "N3", SessionState::Free),
    (T, SessionState::LoggedIn, SessionEvent::Closed, "N3", SessionState::Free),
    (I, SessionState::Failed, SessionEvent::ConnectionLoggedIn, "N4", SessionState::LoggedIn),
    (T, SessionState::InContinue, SessionEvent::ConnectionLoggedIn, "N10", SessionState::LoggedIn),
    (I, SessionState::LoggedIn, SessionEvent::Failed, "N5", SessionState::Failed),
    (T, SessionState::LoggedIn, SessionEvent::Failed, "N5", SessionState::Failed),
    (I, SessionState::Failed, SessionEvent::TimedOutOrReinstated, "N6", SessionState::Free),
    (T, SessionState::Failed, SessionEvent::TimedOutOrReinstated, "N6", SessionState::Free),
    (T, SessionState::Failed, SessionEvent::ContinuationStarted, "N7", SessionState::InContinue),
    (T, SessionState::InContinue, SessionEvent::ContinuationFailed, "N8", SessionState::Failed),
    (T, SessionState::Active, SessionEvent::LeadingLoginFailed, "N9", SessionState::Free),
    (T, SessionState::Active, SessionEvent::TimedOutOrReinstated, "N11", SessionState::Free),
    (T, SessionState::InContinue, SessionEvent::TimedOutOrReinstated, "N11", SessionState::Free),
];

#[test]
fn every_session_transition_of_the_rfc() {
    for &(role, from, event, label, to) in SESSION_TABLE {
        let got = session_transition(role, from, event)
            .unwrap_or_else(|| panic!("{role:?} {from} {event:?} must be {label}"));
        assert_eq!(
            (got.label, got.to),
            (label, to),
            "{role:?} {from} {event:?}"
        );
    }
}

#[test]
fn nothing_outside_the_session_table_is_accepted() {
    for role in [I, T] {
        for from in SESSION_STATES {
            for event in SESSION_EVENTS {
                let in_table = SESSION_TABLE
                    .iter()
                    .any(|&(r, f, e, _, _)| (r, f, e) == (role, from, event));
                let mut machine = SessionStateMachine::in_state(role, from);
                assert_eq!(
                    machine.handle(event).is_ok(),
                    in_table,
                    "{role:?} {from} {event:?}"
                );
                if !in_table {
                    assert_eq!(machine.state(), from);
                }
            }
        }
    }
    // The initiator never sees ACTIVE or IN_CONTINUE.
    for event in SESSION_EVENTS {
        for from in [
            SessionState::Free,
            SessionState::LoggedIn,
            SessionState::Failed,
        ] {
            if let Some(t) = session_transition(I, from, event) {
                assert!(!matches!(
                    t.to,
                    SessionState::Active | SessionState::InContinue
                ));
            }
        }
    }
}

#[test]
fn a_target_session_that_fails_and_is_reinstated() {
    let mut session = SessionStateMachine::new(T);
    let labels: Vec<&str> = [
        SessionEvent::LeadingLoginStarted,
        SessionEvent::ConnectionLoggedIn,
        SessionEvent::Failed,
        SessionEvent::ContinuationStarted,
        SessionEvent::ContinuationFailed,
        SessionEvent::TimedOutOrReinstated,
    ]
    .into_iter()
    .map(|event| session.handle(event).unwrap().label)
    .collect();
    assert_eq!(labels, ["N1", "N2", "N5", "N7", "N8", "N6"]);
    assert_eq!(session.state(), SessionState::Free);
}
