//! How a finished command is answered (RFC 7143 11.4, 11.7): its Data-In
//! cut by MaxRecvDataSegmentLength and MaxBurstLength, the residual, and
//! where its status goes: in the last Data-In when a read succeeded and
//! nothing is kept for SNACKs (phase collapse, 11.7.3), else in a SCSI
//! Response of its own carrying the sense data (11.4.7). At ERL 1 and
//! above a read's status always travels alone, so that a Data-In sent
//! again for a SNACK never carries a status (and its StatSN) twice.
//!
//! No I/O: [`Answer::new`] decides the PDUs, the driver sends them,
//! asking the task table just before the status whether the task still
//! wants one (an ABORT TASK may have ended it meanwhile, 11.5.1).

use iscsi_proto::pdu::{DataIn, Lun, ScsiCommand, ScsiResponse};
use iscsi_proto::serial::{DataSn, StatSn};
use iscsi_proto::transfer::{Limits, Payload, Segment};

use crate::planted::{self, Bug};
use crate::retention::{SentStatus, data_in_header};

/// SCSI status GOOD.
const GOOD: u8 = 0x00;

/// The residual of a command (RFC 7143 11.4.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Residual {
    /// O bit: the command wanted more than the initiator expected.
    pub overflow: bool,
    /// U bit: the command moved less than the initiator expected.
    pub underflow: bool,
    /// The difference, in bytes (saturated at `u32::MAX`).
    pub count: u32,
}

impl Residual {
    /// No residual.
    pub const NONE: Residual = Residual {
        overflow: false,
        underflow: false,
        count: 0,
    };

    /// What the SCSI layer wants to transfer (`wanted`) against what the
    /// initiator expects (`expected`).
    pub fn of(wanted: u64, expected: u32) -> Residual {
        let expected = u64::from(expected);
        match wanted.cmp(&expected) {
            std::cmp::Ordering::Greater => Residual {
                overflow: true,
                underflow: false,
                count: u32::try_from(wanted - expected).unwrap_or(u32::MAX),
            },
            std::cmp::Ordering::Less => Residual {
                overflow: false,
                underflow: true,
                count: (expected - wanted) as u32,
            },
            std::cmp::Ordering::Equal => Residual::NONE,
        }
    }

    /// For any command but a write: the residual of the `sent` bytes of
    /// Data-In (none for a command that reads nothing) against the EDTL.
    /// (A write's is its CDB's transfer length against the EDTL, which
    /// only the SCSI layer knows: [`Residual::of`].)
    pub fn of_data_in(command: &ScsiCommand, sent: usize) -> Residual {
        let expected = command.expected_data_transfer_length;
        if command.read {
            Residual::of(sent as u64, expected)
        } else if expected > 0 {
            Residual::of(0, expected)
        } else {
            Residual::NONE
        }
    }
}

/// What the SCSI layer ended a command with.
#[derive(Clone, Copy, Debug)]
pub struct Outcome<'a> {
    /// The SCSI status.
    pub status: u8,
    /// The sense data (fixed or descriptor format), if any.
    pub sense: Option<&'a [u8]>,
}

/// How one command is answered.
#[derive(Debug)]
pub enum Answer<D> {
    /// A read that succeeded at ERL 0: its status in its last Data-In.
    Collapsed(Collapsed<D>),
    /// Data-In (if any), then a SCSI Response: its `stat_sn` is a
    /// placeholder until sent ([`SentStatus::response_after`]), and
    /// what the connection keeps for SNACKs at ERL 1.
    Separate(SentStatus<D>),
}

impl<D: Payload> Answer<D> {
    /// The answer to `command`, which ended with `outcome` having read
    /// `data_in` (only a read's is sent, up to its EDTL) with `residual`,
    /// after `r2ts` R2Ts (a write's ExpDataSN). `retains`: the connection
    /// keeps statuses for SNACKs (ERL 1 and above).
    pub fn new(
        command: &ScsiCommand,
        outcome: Outcome<'_>,
        data_in: D,
        residual: Residual,
        r2ts: u32,
        retains: bool,
        limits: Limits,
    ) -> Self {
        let sent = if command.read {
            data_in
                .len()
                .min(command.expected_data_transfer_length as usize)
        } else {
            0
        };
        // (Cut only when there is more than is sent: slicing a gather of
        // shared pieces allocates.)
        let data_in = match data_in.len() == sent {
            true => data_in,
            false => data_in.slice(0..sent),
        };
        let itt = command.initiator_task_tag;
        if !retains && outcome.status == GOOD && outcome.sense.is_none() && sent > 0 {
            return Answer::Collapsed(Collapsed {
                itt,
                lun: command.lun,
                segments: limits.data_in_segments(sent as u32),
                data_in,
                residual,
            });
        }
        Answer::Separate(SentStatus {
            stat_sn: StatSn::new(0),
            response: ScsiResponse {
                residual_overflow: residual.overflow,
                residual_underflow: residual.underflow,
                status: outcome.status,
                initiator_task_tag: itt,
                // A read's: the count of its Data-In, set as they are cut
                // (`SentStatus::response_after`).
                exp_data_sn: DataSn::new(if command.read { 0 } else { r2ts }),
                residual_count: residual.count,
                ..ScsiResponse::default()
            },
            sense_data: outcome.sense.map(sense_segment).unwrap_or_default(),
            data_in,
            lun: command.lun,
            limits,
        })
    }
}

/// The data segment of a SCSI Response with sense data: a 2-byte length,
/// then the sense bytes (RFC 7143 11.4.7).
pub fn sense_segment(sense: &[u8]) -> Vec<u8> {
    let length = u16::try_from(sense.len()).unwrap_or(u16::MAX);
    let mut data = Vec::with_capacity(2 + usize::from(length));
    data.extend_from_slice(&length.to_be_bytes());
    data.extend_from_slice(&sense[..usize::from(length)]);
    data
}

/// A read answered in its Data-In alone (ERL 0).
#[derive(Debug)]
pub struct Collapsed<D> {
    itt: u32,
    lun: Lun,
    segments: Vec<Segment>,
    data_in: D,
    residual: Residual,
}

/// One Data-In of a collapsed answer, with its data.
#[derive(Debug)]
pub struct CollapsedPdu<D> {
    /// The header (StatSN, ExpCmdSN and MaxCmdSN stamped when sent).
    pub pdu: DataIn,
    /// Its data.
    pub data: D,
    /// It carries the status (the S bit): it advances StatSN, and goes
    /// only while the task is still wanted (not aborted).
    pub with_status: bool,
}

impl<D: Payload> Collapsed<D> {
    /// The Data-In PDUs in order, the last with the status and residual.
    pub fn pdus(&self) -> impl Iterator<Item = CollapsedPdu<D>> + '_ {
        let count = self.segments.len();
        self.segments.iter().enumerate().map(move |(i, segment)| {
            let with_status = if planted::active(Bug::StatusBeforeLastDataIn) {
                i == 0
            } else {
                i + 1 == count
            };
            let residual = if with_status {
                self.residual
            } else {
                Residual::NONE
            };
            let start = segment.offset as usize;
            CollapsedPdu {
                pdu: DataIn {
                    residual_overflow: residual.overflow,
                    residual_underflow: residual.underflow,
                    status: with_status.then_some(GOOD),
                    residual_count: residual.count,
                    ..data_in_header(self.itt, self.lun, segment)
                },
                data: self.data_in.slice(start..start + segment.length as usize),
                with_status,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(edtl: u32) -> ScsiCommand {
        ScsiCommand {
            read: true,
            final_flag: true,
            initiator_task_tag: 7,
            expected_data_transfer_length: edtl,
            ..ScsiCommand::default()
        }
    }

    fn limits(segment: u32, burst: u32) -> Limits {
        Limits {
            max_send_segment: segment,
            max_recv_segment: segment,
            max_burst_length: burst,
            first_burst_length: burst,
            immediate_data: true,
            initial_r2t: false,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
        }
    }

    const GOOD_OUTCOME: Outcome<'static> = Outcome {
        status: GOOD,
        sense: None,
    };

    #[test]
    fn a_good_read_at_erl_0_carries_its_status_in_the_last_data_in() {
        let data = vec![1u8; 2500];
        let residual = Residual::of(2500, 3000);
        let answer = Answer::new(
            &read(3000),
            GOOD_OUTCOME,
            data,
            residual,
            0,
            false,
            limits(1024, 2048),
        );
        let Answer::Collapsed(collapsed) = answer else {
            panic!("not collapsed");
        };
        let pdus: Vec<_> = collapsed.pdus().collect();
        // Burst 2048 of segments of 1024: 1024, 1024 (F), then 452 (F).
        let shape: Vec<_> = pdus
            .iter()
            .map(|p| (p.pdu.buffer_offset, p.data.len(), p.pdu.final_flag))
            .collect();
        assert_eq!(
            shape,
            [(0, 1024, false), (1024, 1024, true), (2048, 452, true)]
        );
        assert_eq!(
            pdus.iter().map(|p| p.with_status).collect::<Vec<_>>(),
            [false, false, true]
        );
        let last = &pdus[2].pdu;
        assert_eq!(last.status, Some(GOOD));
        assert!(last.residual_underflow && !last.residual_overflow);
        assert_eq!(last.residual_count, 500);
        assert!(pdus[..2].iter().all(|p| p.pdu.residual_count == 0));
        assert_eq!(
            pdus.iter().map(|p| p.pdu.data_sn.get()).collect::<Vec<_>>(),
            [0, 1, 2]
        );
    }

    #[test]
    fn at_erl_1_a_read_status_travels_alone_with_expdatasn_the_data_in_count() {
        let answer = Answer::new(
            &read(4096),
            GOOD_OUTCOME,
            vec![0u8; 4096],
            Residual::NONE,
            0,
            true,
            limits(1024, 4096),
        );
        let Answer::Separate(sent) = answer else {
            panic!("collapsed at ERL 1");
        };
        assert_eq!(sent.data_in.len(), 4096);
        let pdus = sent.limits.data_in_segments(4096).len();
        assert_eq!(pdus, 4);
        assert_eq!(sent.response_after(pdus).exp_data_sn.get(), 4);
    }

    #[test]
    fn a_read_sends_no_more_than_its_edtl_and_a_check_condition_sends_sense() {
        let sense = [0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0];
        let failed = Outcome {
            status: 0x02,
            sense: Some(&sense),
        };
        let answer = Answer::new(
            &read(512),
            failed,
            vec![0u8; 4096],
            Residual::NONE,
            0,
            false,
            limits(8192, 8192),
        );
        let Answer::Separate(sent) = answer else {
            panic!("a check condition collapsed");
        };
        assert_eq!(sent.data_in.len(), 512);
        assert_eq!(sent.response.status, 0x02);
        assert_eq!(&sent.sense_data[..2], &[0, 18]);
        assert_eq!(&sent.sense_data[2..], &sense);
    }

    #[test]
    fn a_write_answers_with_its_r2t_count_and_no_data_in() {
        let write = ScsiCommand {
            write: true,
            final_flag: true,
            expected_data_transfer_length: 8192,
            ..ScsiCommand::default()
        };
        let answer = Answer::new(
            &write,
            GOOD_OUTCOME,
            vec![9u8; 100],
            Residual::NONE,
            3,
            false,
            limits(1024, 4096),
        );
        let Answer::Separate(sent) = answer else {
            panic!("a write collapsed");
        };
        assert!(sent.data_in.is_empty());
        assert_eq!(sent.response_after(0).exp_data_sn.get(), 3);
    }

    #[test]
    fn residuals() {
        assert_eq!(Residual::of(10, 10), Residual::NONE);
        let over = Residual::of(u64::MAX, 1);
        assert!(over.overflow && over.count == u32::MAX);
        let no_data = ScsiCommand {
            expected_data_transfer_length: 512,
            ..ScsiCommand::default()
        };
        assert_eq!(Residual::of_data_in(&no_data, 0).count, 512);
        assert_eq!(
            Residual::of_data_in(&ScsiCommand::default(), 0),
            Residual::NONE
        );
    }
}
