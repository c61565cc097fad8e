//! The log lines of logins that did not make it: one WARN line per refused
//! or timed-out login, saying who (initiator name and address), where (the
//! portal), to what (the target asked for) and why, as structured fields,
//! so that `iscsi --log-format json` gives each as a JSON field.
//!
//! The initiator's and target's names come from the wire: control
//! characters in them are escaped, so that a name cannot end the line and
//! forge another.

use std::net::SocketAddr;

use iscsi_proto::login::target::{LoginRefusal, SentNames};
use tracing::warn;

/// Logs a refused login (`peer` the initiator's address, `portal` ours).
///
/// Fields: `initiator` (the InitiatorName, or "(not sent)"), `peer`,
/// `portal`, `target` (the TargetName, "(discovery)" for a discovery
/// session, or "(not sent)"), `status` (class and detail in hex, as on the
/// wire: "0x0201") and `reason` (in words; a CHAP user is named, a secret
/// never).
pub(crate) fn refused(
    peer: SocketAddr,
    portal: SocketAddr,
    names: &SentNames,
    refusal: &LoginRefusal,
) {
    let status = format!("{:#04x}{:02x}", refusal.status.class, refusal.status.detail);
    warn!(
        initiator = %initiator_label(names),
        %peer,
        %portal,
        target = %target_label(names),
        %status,
        reason = %printable(&refusal.reason.to_string()),
        "login refused"
    );
}

/// Logs a login that did not finish in time: the connection is closed.
/// The names are not known here (the login was dropped with its state).
pub(crate) fn timed_out(peer: SocketAddr, portal: SocketAddr, after: std::time::Duration) {
    warn!(
        %peer,
        %portal,
        seconds = after.as_secs(),
        "login timed out: connection closed"
    );
}

/// The InitiatorName sent, or "(not sent)".
fn initiator_label(names: &SentNames) -> String {
    names
        .initiator_name
        .as_deref()
        .map_or_else(|| "(not sent)".to_owned(), printable)
}

/// The TargetName sent; "(discovery)" for a discovery session, which names
/// none; "(not sent)" otherwise.
fn target_label(names: &SentNames) -> String {
    match (&names.target_name, names.session_type.as_deref()) {
        (Some(name), _) => printable(name),
        (None, Some("Discovery")) => "(discovery)".to_owned(),
        (None, _) => "(not sent)".to_owned(),
    }
}

/// `text` with its control characters escaped (`\n`, `\u{1b}`): one line,
/// and no terminal escapes, whatever the peer sent.
fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_names_are_said_and_discovery_is_named() {
        let none = SentNames::default();
        assert_eq!(initiator_label(&none), "(not sent)");
        assert_eq!(target_label(&none), "(not sent)");
        let discovery = SentNames {
            initiator_name: Some("iqn.x:i".into()),
            target_name: None,
            session_type: Some("Discovery".into()),
        };
        assert_eq!(initiator_label(&discovery), "iqn.x:i");
        assert_eq!(target_label(&discovery), "(discovery)");
    }

    /// A name with a newline would forge a second log line.
    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(
            printable("iqn.x\nWARN login ok\u{1b}[31m"),
            "iqn.x\\nWARN login ok\\u{1b}[31m"
        );
    }
}
