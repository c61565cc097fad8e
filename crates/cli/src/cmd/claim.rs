//! One disk per LUN on this host: the claim an `iscsi attach` or `iscsi
//! mount` holds on what it serves, for as long as its process lives.
//!
//! Looking for an existing device or mount before making one leaves a
//! window: two commands started together both look, both find nothing and
//! both go on, and two page caches then write one LUN. A claim closes it:
//! an exclusive `flock` on a file named after what is served, taken before
//! the look and held until the process ends. The kernel drops the lock when
//! the process dies, SIGKILL included, so a claim never outlives its
//! holder, and a free claim with a device or mount still there means that
//! device or mount is a dead one's leftover.
//!
//! The files live in `/run/iscsi-rs/claims` (root), else in
//! `$XDG_RUNTIME_DIR/iscsi-rs/claims`, else `/tmp/iscsi-rs-claims-UID`;
//! each holds the pid of its last holder, for the refusal's message.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::PathBuf;

use anyhow::Context;

/// A held claim; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct Claim {
    _file: File,
}

/// Why a claim was not taken.
#[derive(Debug)]
pub enum Refused {
    /// Another live process holds it: its pid, when it wrote one.
    Held(Option<u32>),
    /// The claim file could not be made or locked.
    Failed(anyhow::Error),
}

impl Claim {
    /// Takes the claim on `what` (of `kind`: "attach" or "mount"), without
    /// waiting.
    pub fn take(kind: &str, what: &str) -> Result<Claim, Refused> {
        let path = path(kind, what).map_err(Refused::Failed)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("the claim file {}", path.display()))
            .map_err(Refused::Failed)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                return Err(Refused::Held(text.trim().parse().ok()));
            }
            Err(TryLockError::Error(error)) => {
                return Err(Refused::Failed(
                    anyhow::Error::new(error)
                        .context(format!("locking the claim file {}", path.display())),
                ));
            }
        }
        // The pid is only for messages: failing to write it loses nothing.
        let _ = file
            .set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{}", std::process::id()));
        Ok(Claim { _file: file })
    }
}

/// The claim file of `what`: its name a hash of it (portals and target
/// names hold characters a file name should not).
fn path(kind: &str, what: &str) -> anyhow::Result<PathBuf> {
    let dir = claims_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("making {}", dir.display()))?;
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in what.bytes() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    Ok(dir.join(format!("{kind}-{hash:016x}.lock")))
}

fn claims_dir() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/run/iscsi-rs/claims");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join("iscsi-rs/claims"),
        _ => std::env::temp_dir().join(format!("iscsi-rs-claims-{}", nix::unistd::getuid())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_is_held_until_dropped_and_names_its_holder() {
        let what = format!("iscsi://127.0.0.1:1/claim-test-{}", std::process::id());
        let claim = Claim::take("test", &what).expect("a free claim is taken");
        match Claim::take("test", &what) {
            Err(Refused::Held(pid)) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("a held claim was not refused: {other:?}"),
        }
        // Something else is not held.
        let other = Claim::take("test", &format!("{what}-other")).expect("another claim");
        drop(claim);
        let again = Claim::take("test", &what).expect("a released claim is taken again");
        drop((again, other));
        let _ = std::fs::remove_file(path("test", &what).unwrap());
        let _ = std::fs::remove_file(path("test", &format!("{what}-other")).unwrap());
    }
}
