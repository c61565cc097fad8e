//! The local control socket: JSON lines over a Unix socket (mode 0600,
//! and every peer's uid checked against the target's own), which `iscsi
//! target status|reload|check|logout`, `socat` and `jq` all drive.
//!
//! One request per line, one answer per line:
//!
//! ```text
//! {"command":"status"}                      -> {"ok":true,"status":{...}}
//! {"command":"reload","force":false}        -> {"ok":true,"changes":[...],"forced":false}
//! {"command":"plan","config":"<toml>"}      -> {"ok":true,"changes":[...]}
//! {"command":"logout","tsih":3}             -> {"ok":true,"initiator":"iqn..."}
//! {"command":"resize","target":"iqn...","lun":0,"size":2147483648,"force":false,"discard":false}
//!                                           -> {"ok":true,"resized":{"old":...,"new":...,"note":null}}
//! {"command":"snapshot","target":"iqn...","lun":0,"name":"nightly"}
//!                                           -> {"ok":true,"snapshot":{"name":"nightly",...}}
//! {"command":"snapshots","target":"iqn...","lun":0}
//!                                           -> {"ok":true,"snapshots":[...]}
//! {"command":"delete_snapshot","target":"iqn...","lun":0,"name":"nightly"}
//!                                           -> {"ok":true}
//! anything else                             -> {"ok":false,"error":"..."}
//! ```

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tracing::{info, warn};

use crate::server::ServerHandle;

/// The longest request line: a whole configuration file fits.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;

/// A request, as the socket carries it.
#[derive(Debug, Deserialize, PartialEq, Eq)]
#[serde(tag = "command", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// The status (a struct variant, so that unknown fields are refused
    /// here too).
    Status {},
    /// Re-read the configuration file and apply it.
    Reload {
        /// Apply disruptive changes too.
        #[serde(default)]
        force: bool,
    },
    /// What a configuration would change, applying nothing.
    Plan {
        /// The file's contents.
        config: String,
    },
    /// Ask a session to log out.
    Logout {
        /// Its TSIH.
        tsih: u16,
    },
    /// Resize one LUN in place.
    Resize {
        /// The target's name.
        target: String,
        /// The LUN.
        lun: u16,
        /// The new size in bytes; absent: what the medium holds now.
        #[serde(default)]
        size: Option<u64>,
        /// A shrink is meant.
        #[serde(default)]
        force: bool,
        /// Data beyond a shrink's new end may be dropped.
        #[serde(default)]
        discard: bool,
    },
    /// Take a snapshot of one LUN.
    Snapshot {
        /// The target's name.
        target: String,
        /// The LUN.
        lun: u16,
        /// The snapshot's name.
        name: String,
    },
    /// List one LUN's snapshots.
    Snapshots {
        /// The target's name.
        target: String,
        /// The LUN.
        lun: u16,
    },
    /// Delete one snapshot of one LUN.
    DeleteSnapshot {
        /// The target's name.
        target: String,
        /// The LUN.
        lun: u16,
        /// The snapshot's name.
        name: String,
    },
}

impl Request {
    /// Parses one request line; the error says what is wrong.
    pub fn parse(line: &str) -> Result<Request, String> {
        serde_json::from_str(line).map_err(|e| format!("bad request: {e}"))
    }
}

/// Where the control socket is unless `--control` says otherwise:
/// `/run/iscsi-rs/target.sock` for root (the unit's RuntimeDirectory),
/// `$XDG_RUNTIME_DIR/iscsi-rs/target.sock` or `/tmp/iscsi-rs-UID/target.sock`
/// for anyone else.
pub fn default_path() -> PathBuf {
    let uid = rustix::process::geteuid().as_raw();
    let dir = if uid == 0 {
        PathBuf::from("/run/iscsi-rs")
    } else if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR") {
        PathBuf::from(runtime).join("iscsi-rs")
    } else {
        PathBuf::from(format!("/tmp/iscsi-rs-{uid}"))
    };
    dir.join("target.sock")
}

/// Binds the control socket at `path`: its directory is made (0700) when
/// missing, a socket left by a target that is gone is replaced, one a
/// running target answers on is not (an error naming it).
pub async fn bind(path: &Path) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
        && !dir.exists()
    {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    if path.exists() {
        if UnixStream::connect(path).await.is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "{}: another target answers on this control socket (give --control PATH)",
                    path.display()
                ),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Serves requests on `listener` until the task is dropped.
pub async fn serve(listener: UnixListener, handle: ServerHandle) {
    let owner = rustix::process::geteuid().as_raw();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                warn!(%error, "control socket: accept failed");
                continue;
            }
        };
        let uid = stream.peer_cred().map(|c| c.uid()).ok();
        if uid != Some(owner) {
            warn!(
                ?uid,
                owner, "control socket: refused a peer that is not the target's owner"
            );
            let mut stream = stream;
            let refusal = json!({"ok": false, "error": "refused: only the target's owner may use its control socket"});
            let _ = stream.write_all(format!("{refusal}\n").as_bytes()).await;
            continue;
        }
        let handle = handle.clone();
        tokio::spawn(async move {
            if let Err(error) = serve_client(stream, handle).await {
                warn!(%error, "control socket: client ended");
            }
        });
    }
}

async fn serve_client(stream: UnixStream, handle: ServerHandle) -> io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut lines)
            .take(MAX_REQUEST_BYTES as u64 + 1)
            .read_until(b'\n', &mut line)
            .await?;
        if n == 0 {
            return Ok(());
        }
        if line.len() > MAX_REQUEST_BYTES {
            let answer = json!({"ok": false, "error": format!("request longer than {MAX_REQUEST_BYTES} bytes")});
            write.write_all(format!("{answer}\n").as_bytes()).await?;
            return Ok(());
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        let answer = answer(&handle, text).await;
        write.write_all(format!("{answer}\n").as_bytes()).await?;
    }
}

/// The answer to one request line.
pub async fn answer(handle: &ServerHandle, line: &str) -> Value {
    let request = match Request::parse(line) {
        Ok(request) => request,
        Err(error) => return json!({"ok": false, "error": error}),
    };
    match request {
        Request::Status {} => json!({"ok": true, "status": handle.status()}),
        Request::Reload { force } => {
            info!(force, "reload asked on the control socket");
            match handle.reload(force).await {
                Ok(report) => {
                    json!({"ok": true, "changes": report.changes, "forced": report.forced})
                }
                Err(error) => {
                    let changes = error.plan().map(|p| p.changes.clone()).unwrap_or_default();
                    json!({"ok": false, "error": error.to_string(), "changes": changes})
                }
            }
        }
        Request::Plan { config } => match handle.plan(&config) {
            Ok(plan) => json!({"ok": true, "changes": plan.changes}),
            Err(error) => json!({"ok": false, "error": error.to_string()}),
        },
        Request::Logout { tsih } => match handle.logout(tsih) {
            Some(initiator) => json!({"ok": true, "initiator": initiator}),
            None => json!({"ok": false, "error": format!("no session with TSIH {tsih}")}),
        },
        Request::Resize {
            target,
            lun,
            size,
            force,
            discard,
        } => {
            info!(%target, lun, ?size, force, discard, "resize asked on the control socket");
            match handle.resize(&target, lun, size, force, discard).await {
                Ok(report) => json!({"ok": true, "resized": report}),
                Err(error) => json!({"ok": false, "error": error}),
            }
        }
        Request::Snapshot { target, lun, name } => {
            info!(%target, lun, %name, "snapshot asked on the control socket");
            match handle.snapshot(&target, lun, &name).await {
                Ok(report) => json!({"ok": true, "snapshot": report}),
                Err(error) => json!({"ok": false, "error": error}),
            }
        }
        Request::Snapshots { target, lun } => match handle.snapshots(&target, lun).await {
            Ok(list) => json!({"ok": true, "snapshots": list}),
            Err(error) => json!({"ok": false, "error": error}),
        },
        Request::DeleteSnapshot { target, lun, name } => {
            info!(%target, lun, %name, "snapshot deletion asked on the control socket");
            match handle.delete_snapshot(&target, lun, &name).await {
                Ok(()) => json!({"ok": true}),
                Err(error) => json!({"ok": false, "error": error}),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse() {
        assert_eq!(
            Request::parse(r#"{"command":"status"}"#),
            Ok(Request::Status {})
        );
        assert_eq!(
            Request::parse(r#"{"command":"reload"}"#),
            Ok(Request::Reload { force: false })
        );
        assert_eq!(
            Request::parse(r#"{"command":"logout","tsih":7}"#),
            Ok(Request::Logout { tsih: 7 })
        );
        assert_eq!(
            Request::parse(r#"{"command":"resize","target":"t","lun":1,"size":4096}"#),
            Ok(Request::Resize {
                target: "t".into(),
                lun: 1,
                size: Some(4096),
                force: false,
                discard: false
            })
        );
        assert_eq!(
            Request::parse(r#"{"command":"delete_snapshot","target":"t","lun":2,"name":"n"}"#),
            Ok(Request::DeleteSnapshot {
                target: "t".into(),
                lun: 2,
                name: "n".into()
            })
        );
        for bad in [
            "",
            "status",
            r#"{"command":"snapshot","target":"t","lun":0}"#,
            r#"{"command":"snapshots","target":"t"}"#,
            r#"{"command":"snapshot","target":"t","lun":0,"name":"n","force":true}"#,
            r#"{"command":"format"}"#,
            r#"{"command":"logout"}"#,
            r#"{"command":"logout","tsih":70000}"#,
            r#"{"command":"status","colour":1}"#,
            r#"{"command":"resize","target":"t"}"#,
            r#"{"command":"resize","target":"t","lun":0,"size":-1}"#,
            r#"{"command":"resize","target":"t","lun":0,"size":"2G"}"#,
        ] {
            assert!(Request::parse(bad).is_err(), "accepted {bad:?}");
        }
    }
}
