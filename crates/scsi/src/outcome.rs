//! What a command ends with: its SAM status and any sense data.

use iscsi_sense::Sense;

/// SAM-5 status codes.
pub mod status {
    /// GOOD.
    pub const GOOD: u8 = 0x00;
    /// CHECK CONDITION: sense data describes the error.
    pub const CHECK_CONDITION: u8 = 0x02;
    /// BUSY: the logical unit cannot take the command now; the initiator
    /// sends it again later (SAM-5 5.3.1).
    pub const BUSY: u8 = 0x08;
    /// RESERVATION CONFLICT.
    pub const RESERVATION_CONFLICT: u8 = 0x18;
    /// TASK SET FULL: the LU's queue for this initiator is full; the
    /// initiator lowers its queue depth and sends the command again
    /// (SAM-5 5.3.1).
    pub const TASK_SET_FULL: u8 = 0x28;
}

/// The outcome of one command. Data-In has been written to the caller's
/// buffer; on any other status that buffer is empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandOutcome {
    /// SAM status: [`status::GOOD`], [`status::CHECK_CONDITION`],
    /// [`status::BUSY`], [`status::RESERVATION_CONFLICT`] or
    /// [`status::TASK_SET_FULL`].
    pub status: u8,
    /// Sense data, present exactly when the status is CHECK CONDITION.
    pub sense: Option<Sense>,
    /// Whether the LU's control mode page has D_SENSE set, so the sense
    /// goes out in descriptor format; [`CommandOutcome::sense_bytes`]
    /// applies it.
    pub descriptor_sense: bool,
}

impl CommandOutcome {
    /// GOOD status, no sense.
    pub const GOOD: Self = Self {
        status: status::GOOD,
        sense: None,
        descriptor_sense: false,
    };

    /// RESERVATION CONFLICT status, no sense (SPC-4 §5.12.1).
    pub const RESERVATION_CONFLICT: Self = Self {
        status: status::RESERVATION_CONFLICT,
        sense: None,
        descriptor_sense: false,
    };

    /// BUSY status, no sense: what a command gets while its LU's store
    /// says "not now, soon" (an I/O error of kind
    /// [`std::io::ErrorKind::WouldBlock`]: a fenced RBD gateway rejoining
    /// the cluster). Initiators send a BUSY command again without telling
    /// the application: Linux's SCSI midlayer requeues it (bounded by the
    /// command's retries times its timeout), QEMU's iSCSI driver retries it
    /// after 8 ms to 2 s; a CHECK CONDITION with NOT READY, LOGICAL UNIT
    /// COMMUNICATION FAILURE fails the I/O up in both.
    pub const BUSY: Self = Self {
        status: status::BUSY,
        sense: None,
        descriptor_sense: false,
    };

    /// TASK SET FULL status, no sense: a command over a QoS limit whose
    /// queue is full. Nothing of it ran; Linux's SCSI midlayer lowers the
    /// device's queue depth and requeues it, libiscsi and QEMU retry it
    /// as they do BUSY.
    pub const TASK_SET_FULL: Self = Self {
        status: status::TASK_SET_FULL,
        sense: None,
        descriptor_sense: false,
    };

    /// CHECK CONDITION with `sense` (fixed format).
    pub const fn check_condition(sense: Sense) -> Self {
        Self {
            status: status::CHECK_CONDITION,
            sense: Some(sense),
            descriptor_sense: false,
        }
    }

    /// The sense bytes for the SCSI Response: fixed format, or descriptor
    /// format when D_SENSE is set; empty without sense.
    pub fn sense_bytes(&self) -> Vec<u8> {
        self.sense
            .map(|s| s.encode(self.descriptor_sense))
            .unwrap_or_default()
    }

    /// Whether the status is GOOD.
    pub const fn is_good(&self) -> bool {
        self.status == status::GOOD
    }
}

/// Why a command failed: CHECK CONDITION with sense, RESERVATION CONFLICT
/// status, or BUSY status (the store asks for the command again soon).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fail {
    Check(Sense),
    Conflict,
    Busy,
}

impl From<Sense> for Fail {
    fn from(s: Sense) -> Self {
        Self::Check(s)
    }
}
