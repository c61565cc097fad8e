//! What a SCSI Command PDU becomes once the task table has admitted its
//! task (RFC 7143 11.3, 7.8): refused with a Reject, run at once, failed
//! once its unsolicited data is in, or a write collecting its data; and
//! what a data digest error in its immediate data turns it into.
//!
//! The driver reads the immediate data (into the write's buffer, or to
//! drop it) and does what [`route`] says; a simulator calls the same.

use iscsi_proto::pdu::{RejectReason, ScsiCommand};
use iscsi_proto::transfer::{DataOutTracker, Limits, UNSOLICITED_TRANSFER_TAG};

use crate::collect::Due;
use crate::solicit::Solicitation;

/// Where an admitted command goes.
#[derive(Debug)]
pub enum Route {
    /// Its PDU is rejected (after its immediate data is read and dropped,
    /// so that a digest error there answers first) and its task ends.
    Reject(RejectReason),
    /// It moves no data out: run it now.
    Run,
    /// A write longer than the target buffers: CHECK CONDITION INVALID
    /// FIELD IN CDB, once the unsolicited data still due is in (7.8).
    TooLong(Due),
    /// A write: its immediate data goes into a buffer of its EDTL, checked
    /// by this tracker; then it collects the rest ([`solicitation`]).
    Collect(DataOutTracker),
}

/// The route of `command`, which came with `immediate` bytes of data on a
/// session that `serves_scsi` (a discovery session does not), on a target
/// that buffers writes of up to `max_write` bytes.
pub fn route(
    command: &ScsiCommand,
    immediate: u32,
    limits: &Limits,
    serves_scsi: bool,
    max_write: u32,
) -> Route {
    if !serves_scsi {
        return Route::Reject(RejectReason::CommandNotSupported);
    }
    if !command.write {
        // Data with a command that moves none out breaks 11.3.4.
        return match immediate {
            0 => Route::Run,
            _ => Route::Reject(RejectReason::ProtocolError),
        };
    }
    let expected = command.expected_data_transfer_length;
    if expected > max_write {
        return Route::TooLong(Due::unsolicited_after(limits, expected, immediate));
    }
    match DataOutTracker::new(*limits, expected, immediate) {
        Ok(tracker) => Route::Collect(tracker),
        Err(error) => Route::Reject(error.reject_reason()),
    }
}

/// What a data digest error in a write's immediate data makes of it: the
/// PDU is rejected either way (Data Digest Error).
#[derive(Debug)]
pub enum DamagedImmediate {
    /// ERL 1 and above: its bytes are asked for again by a recovery R2T.
    AskAgain,
    /// ERL 0: the write ends in CHECK CONDITION, PROTOCOL SERVICE CRC
    /// ERROR, once the unsolicited data still due is in.
    Fail(Due),
}

/// A write's `immediate` bytes of data came with a bad digest.
pub fn damaged_immediate(
    command: &ScsiCommand,
    immediate: u32,
    tracker: &mut DataOutTracker,
    limits: &Limits,
) -> DamagedImmediate {
    if limits.error_recovery_level > 0 {
        tracker.discard(UNSOLICITED_TRANSFER_TAG, 0, immediate);
        return DamagedImmediate::AskAgain;
    }
    let expected = command.expected_data_transfer_length;
    DamagedImmediate::Fail(Due::unsolicited_after(limits, expected, immediate))
}

/// The R2Ts of a write whose immediate data is in: what its tracker still
/// wants solicited, in bursts of MaxBurstLength.
pub fn solicitation(
    command: &ScsiCommand,
    tracker: &DataOutTracker,
    limits: &Limits,
) -> Solicitation {
    let expected = command.expected_data_transfer_length;
    let bursts = limits.r2t_bursts(expected, tracker.solicited_from());
    Solicitation::new(command.lun, command.initiator_task_tag, bursts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(erl: u8) -> Limits {
        Limits {
            max_send_segment: 8192,
            max_recv_segment: 8192,
            max_burst_length: 65536,
            first_burst_length: 16384,
            immediate_data: true,
            initial_r2t: false,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: erl,
        }
    }

    fn write(edtl: u32) -> ScsiCommand {
        ScsiCommand {
            write: true,
            final_flag: false,
            expected_data_transfer_length: edtl,
            ..ScsiCommand::default()
        }
    }

    #[test]
    fn commands_are_routed_by_session_direction_and_length() {
        let l = limits(0);
        let read = ScsiCommand {
            read: true,
            final_flag: true,
            ..ScsiCommand::default()
        };
        assert!(matches!(
            route(&read, 0, &l, false, 1 << 20),
            Route::Reject(RejectReason::CommandNotSupported)
        ));
        assert!(matches!(route(&read, 0, &l, true, 1 << 20), Route::Run));
        assert!(matches!(
            route(&read, 512, &l, true, 1 << 20),
            Route::Reject(RejectReason::ProtocolError)
        ));
        // 16 KiB of unsolicited data is due after 4 KiB immediate.
        let Route::TooLong(due) = route(&write(2 << 20), 4096, &l, true, 1 << 20) else {
            panic!("a write past the buffer was not refused");
        };
        assert_eq!(due.unsolicited, 12288);
        // More immediate data than FirstBurstLength.
        assert!(matches!(
            route(&write(65536), 32768, &l, true, 1 << 20),
            Route::Reject(_)
        ));
        assert!(matches!(
            route(&write(65536), 4096, &l, true, 1 << 20),
            Route::Collect(_)
        ));
    }

    #[test]
    fn damaged_immediate_data_is_asked_again_at_erl_1_and_fails_the_write_at_erl_0() {
        let command = write(65536);
        for erl in [0, 1] {
            let l = limits(erl);
            let Route::Collect(mut tracker) = route(&command, 4096, &l, true, 1 << 20) else {
                panic!("not collecting");
            };
            match damaged_immediate(&command, 4096, &mut tracker, &l) {
                DamagedImmediate::AskAgain => {
                    assert_eq!(erl, 1);
                    assert_eq!(tracker.take_lost(), [(0, 4096)]);
                }
                DamagedImmediate::Fail(due) => {
                    assert_eq!(erl, 0);
                    assert_eq!(due.unsolicited, 12288);
                }
            }
        }
    }

    #[test]
    fn a_collecting_write_solicits_what_is_not_unsolicited() {
        let l = limits(0);
        let command = write(65536);
        let Route::Collect(tracker) = route(&command, 4096, &l, true, 1 << 20) else {
            panic!("not collecting");
        };
        assert!(!solicitation(&command, &tracker, &l).all_sent());
    }
}
