//! What `iscsi target` tells its service manager: the sd_notify(3)
//! protocol (a datagram of `KEY=VALUE` lines to the Unix socket named by
//! `NOTIFY_SOCKET`), through the pure-Rust `sd-notify` crate.
//!
//! The unit (`packaging/iscsi-target.service`) is `Type=notify-reload`:
//! - [`serving`] once every portal is bound and SIGHUP is caught (READY=1),
//!   so `systemctl start` returns only when the target accepts logins;
//! - [`reloading`] when SIGHUP arrives, before the configuration is read
//!   again: `RELOADING=1` with `MONOTONIC_USEC`, which systemd 253 and
//!   later require (without it the reload fails and the service is
//!   stopped); `systemctl reload` waits for the READY=1 of [`reloaded`],
//!   sent when the reload is applied or refused;
//! - [`stopping`] when SIGTERM (or SIGINT) arrives, before the initiators
//!   are asked to log out;
//! - [`status`]: the one line `systemctl status` shows (`STATUS=`).
//!
//! Without `NOTIFY_SOCKET` (not started by systemd as `Type=notify*`)
//! every function does nothing. A message that cannot be sent is logged
//! and otherwise ignored: the target serves on whatever its manager thinks.

use iscsi_target::ServerHandle;
use iscsi_target::reload::{ReloadError, ReloadReport};
use iscsi_target::status::Status;
use sd_notify::NotifyState;

/// Sends `states` in one datagram, if there is a service manager to tell.
fn send(states: &[NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(error) = sd_notify::notify(states) {
        let what: Vec<String> = states.iter().map(|s| s.to_string()).collect();
        tracing::warn!("telling the service manager {}: {error}", what.join(" "));
    }
}

/// Startup or a reload is finished: the target serves what it was given.
/// `status` becomes the unit's status line.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// A reload begins (first thing on SIGHUP, before the file is read; then
/// [`reloaded`] when it is applied or refused).
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[
            NotifyState::Reloading,
            now,
            NotifyState::Status("reloading the configuration"),
        ]),
        // CLOCK_MONOTONIC does not fail on Linux; were it to, RELOADING=1
        // alone still works with systemd before 253.
        Err(error) => {
            tracing::warn!("reading CLOCK_MONOTONIC for the service manager: {error}");
            send(&[NotifyState::Reloading]);
        }
    }
}

/// A reload is over, applied or refused (the old configuration then stays
/// and serves): READY=1 again, which ends `systemctl reload`, with a status
/// line saying what runs and how the reload went.
pub fn reloaded(handle: &ServerHandle, outcome: Result<&ReloadReport, &ReloadError>) {
    let serving = serving_status(&handle.status());
    let line = match outcome {
        Ok(report) => format!("{serving} (reloaded: {} change(s))", report.changes.len()),
        Err(error) => format!("{serving} (reload: {error})"),
    };
    ready(&line);
}

/// Shutdown begins: the initiators are being asked to log out.
pub fn stopping() {
    send(&[
        NotifyState::Stopping,
        NotifyState::Status("stopping: asking initiators to log out"),
    ]);
}

/// A new status line for `systemctl status`, without a change of state.
#[allow(dead_code, reason = "for status changes between reloads")]
pub fn status(text: &str) {
    send(&[NotifyState::Status(text)]);
}

/// The status line of a target: its targets and where it listens.
pub fn serving_status(status: &Status) -> String {
    let portals: Vec<String> = status
        .portals
        .iter()
        .map(|p| match p.transport.as_str() {
            "tcp" => p.address.to_string(),
            other => format!("{} ({other})", p.address),
        })
        .collect();
    let targets = status.targets.len();
    let plural = if targets == 1 { "" } else { "s" };
    format!("serving {targets} target{plural} on {}", portals.join(", "))
}

/// Startup is finished: READY=1 with the status line of [`serving_status`].
pub fn serving(handle: &ServerHandle) {
    ready(&serving_status(&handle.status()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use iscsi_target::status::PortalStatus;

    fn status(targets: usize, portals: &[(&str, &str)]) -> Status {
        let status = serde_json::json!({
            "pid": 1,
            "config_file": null,
            "portals": portals
                .iter()
                .map(|(t, a)| PortalStatus { transport: t.to_string(), address: a.parse().unwrap() })
                .collect::<Vec<_>>(),
            "targets": (0..targets).map(|i| serde_json::json!({
                "name": format!("iqn.2026-11.rs.iscsi:t{i}"), "alias": null,
                "allowed_initiators": [], "chap": "none", "luns": [], "sessions": 0,
            })).collect::<Vec<_>>(),
            "sessions": [],
        });
        serde_json::from_value(status).expect("a Status")
    }

    #[test]
    fn status_lines() {
        assert_eq!(
            serving_status(&status(1, &[("tcp", "127.0.0.1:3260")])),
            "serving 1 target on 127.0.0.1:3260"
        );
        assert_eq!(
            serving_status(&status(
                2,
                &[
                    ("tcp", "127.0.0.1:3260"),
                    ("tcp", "[::1]:3260"),
                    ("iser", "127.0.0.1:3262")
                ]
            )),
            "serving 2 targets on 127.0.0.1:3260, [::1]:3260, 127.0.0.1:3262 (iser)"
        );
    }
}
