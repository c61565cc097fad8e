//! The LU's SANITIZE state ([`SanitizeState`]): what the LU holds and
//! every command is gated by, apart from the operations of `sanitize` that
//! change it, so that the LU's state can hold it without importing them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};

use crate::cdb::opcode;
use iscsi_sense::{Asc, Sense, SenseKey};

/// NOT READY / SANITIZE IN PROGRESS.
pub(crate) const IN_PROGRESS: Sense = Sense::new(SenseKey::NotReady, Asc::SANITIZE_IN_PROGRESS);
/// MEDIUM ERROR / SANITIZE COMMAND FAILED: the failure state's answer.
pub const FAILED: Sense = Sense::new(SenseKey::MediumError, Asc::SANITIZE_COMMAND_FAILED);

/// How far a running sanitize is, in 65536ths, written by the operation
/// and read by every command refused meanwhile.
#[derive(Debug, Default)]
pub(crate) struct Progress(AtomicU16);

impl Progress {
    pub(crate) fn set(&self, done: u64, total: u64) {
        let frac = u128::from(done) * 0xFFFF / u128::from(total.max(1));
        self.0
            .store(u16::try_from(frac).unwrap_or(u16::MAX), Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u16 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Where an LU stands with SANITIZE.
#[derive(Debug, Default, Clone)]
pub(crate) enum SanitizeState {
    /// No sanitize running or failed.
    #[default]
    Idle,
    /// An operation runs; its progress.
    Running(Arc<Progress>),
    /// The last operation failed; `ause` as that command had it.
    Failed {
        /// EXIT FAILURE MODE is allowed.
        ause: bool,
    },
}

impl SanitizeState {
    /// Whether there is nothing to gate.
    pub fn is_idle(&self) -> bool {
        matches!(self, Self::Idle)
    }

    /// What REQUEST SENSE reports in this state, if anything.
    pub fn sense(&self) -> Option<Sense> {
        match self {
            Self::Idle => None,
            Self::Running(p) => Some(IN_PROGRESS.with_progress(p.get())),
            Self::Failed { .. } => Some(FAILED),
        }
    }

    /// The check made before a command runs: `Err` with the sense it ends
    /// in when the state forbids it (see the module's documentation).
    pub fn gate(&self, cdb: &[u8]) -> Result<(), Sense> {
        use opcode::*;
        let op = cdb.first().copied().unwrap_or(0xFF);
        let always = matches!(op, INQUIRY | REPORT_LUNS | REQUEST_SENSE | MAINTENANCE_IN);
        match self {
            Self::Idle => Ok(()),
            _ if always => Ok(()),
            Self::Failed { .. } if op == SANITIZE => Ok(()),
            other => Err(other.sense().unwrap_or(FAILED)),
        }
    }
}
