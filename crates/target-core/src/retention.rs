//! ErrorRecoveryLevel 1 on the target (RFC 7143 sections 7.1-7.4, 11.16):
//! what a connection keeps so that a SNACK can be answered, and which PDUs
//! answer one. No I/O here: the connection sends what [`Retained::answer`]
//! returns.
//!
//! At ERL 1 every SCSI Response is kept, with the Data-In of its command,
//! until the initiator acknowledges it: ExpStatSN past its StatSN on any
//! later PDU (section 4.2.2.2). The Data-In is kept as it was sent (the
//! target keeps the `iscsi_datamover::Gather` it was sent from, a
//! [`Payload`]), so a retransmission sends the very bytes the first one did
//! (a RAM LUN's chunks are shared, and a later write copies a lent chunk
//! rather than change it). Memory is bounded: past [`RETAINED_BYTES`] of
//! data per connection the oldest are dropped, and a SNACK for them gets a
//! Reject, after which the initiator falls back to ERL 0's answer (a new
//! session).
//!
//! The target asks for no DataACK (the A bit, section 11.7.2): status
//! acknowledgement frees everything, and DataACK only lets a long read
//! free its data earlier.

use std::collections::VecDeque;

use iscsi_proto::pdu::{
    DataIn, Lun, Pdu, RESERVED_TAG, ReadyToTransfer, RejectReason, ScsiResponse, SnackRequest,
    SnackType,
};
use iscsi_proto::serial::{DataSn, StatSn};
use iscsi_proto::transfer::{Limits, Payload, Segment};

/// The most Data-In bytes one connection keeps for retransmission.
pub const RETAINED_BYTES: usize = 64 << 20;

/// A status sent and not yet acknowledged, with its command's Data-In.
#[derive(Clone, Debug)]
pub struct SentStatus<D> {
    /// The StatSN it went out with.
    pub stat_sn: StatSn,
    /// The SCSI Response as sent (sequence numbers are stamped again).
    pub response: ScsiResponse,
    /// Its data segment (sense data).
    pub sense_data: Vec<u8>,
    /// The Data-In sent before it (empty for commands that read nothing).
    pub data_in: D,
    /// The command's LUN.
    pub lun: Lun,
    /// The limits the Data-In was cut by.
    pub limits: Limits,
}

impl<D: Payload> SentStatus<D> {
    /// The Data-In (without status) that carries `segment` of the task's
    /// data, and that data: sent first, sent again for a SNACK, and sent
    /// again after a TASK REASSIGN.
    pub fn data_in(&self, segment: &Segment) -> (DataIn, D) {
        let start = segment.offset as usize;
        let data = self.data_in.slice(start..start + segment.length as usize);
        let itt = self.response.initiator_task_tag;
        (data_in_header(itt, self.lun, segment), data)
    }

    /// The SCSI Response to send after the Data-In, `data_in_pdus` of them
    /// (as the sender cut them by `limits`): ExpDataSN their count when it
    /// follows any, else as kept (a write's R2T count).
    pub fn response_after(&self, data_in_pdus: usize) -> ScsiResponse {
        let mut response = self.response.clone();
        if !self.data_in.is_empty() {
            let count = u32::try_from(data_in_pdus).unwrap_or(u32::MAX);
            response.exp_data_sn = DataSn::new(count);
        }
        response
    }
}

/// The header of the Data-In that carries `segment` of task `itt`'s data,
/// without status: what every Data-In of a task shares, whether it is
/// sent first, sent again, or carries the status (phase collapse).
pub fn data_in_header(itt: u32, lun: Lun, segment: &Segment) -> DataIn {
    DataIn {
        final_flag: segment.last_in_sequence,
        lun,
        initiator_task_tag: itt,
        target_transfer_tag: RESERVED_TAG,
        data_sn: DataSn::new(segment.data_sn),
        buffer_offset: segment.offset,
        ..DataIn::default()
    }
}

/// One PDU to send again in answer to a SNACK.
#[derive(Debug)]
pub enum Resend<D> {
    /// A Data-In, without status, with its data.
    DataIn(DataIn, D),
    /// A SCSI Response with the StatSN it first had.
    Response(ScsiResponse, Vec<u8>, StatSn),
    /// An R2T of a write still collecting its data, as first sent.
    R2t(ReadyToTransfer),
}

/// Why a SNACK cannot be answered: the Reject's reason and a log line.
pub type Refusal = (RejectReason, &'static str);

/// The statuses of one connection not yet acknowledged, oldest first.
#[derive(Debug)]
pub struct Retained<D> {
    sent: VecDeque<SentStatus<D>>,
    bytes: usize,
    /// Statuses dropped unacknowledged to stay within [`RETAINED_BYTES`].
    pub evicted: u64,
}

impl<D> Default for Retained<D> {
    fn default() -> Self {
        Self {
            sent: VecDeque::new(),
            bytes: 0,
            evicted: 0,
        }
    }
}

impl<D: Payload> Retained<D> {
    /// Keeps a status just sent.
    pub fn keep(&mut self, status: SentStatus<D>) {
        self.bytes += status.data_in.len();
        self.sent.push_back(status);
        while self.bytes > RETAINED_BYTES && self.sent.len() > 1 {
            self.drop_oldest();
            self.evicted += 1;
        }
    }

    /// Takes every status kept (the connection failed at ERL 2: they wait
    /// for TASK REASSIGN in the session, `recovery`).
    pub fn take_all(&mut self) -> Vec<SentStatus<D>> {
        self.bytes = 0;
        self.sent.drain(..).collect()
    }

    /// Drops what the initiator has acknowledged: every status before
    /// `exp_stat_sn`.
    pub fn acknowledge(&mut self, exp_stat_sn: StatSn) {
        while self
            .sent
            .front()
            .is_some_and(|oldest| oldest.stat_sn.lt(exp_stat_sn))
        {
            self.drop_oldest();
        }
    }

    fn drop_oldest(&mut self) {
        if let Some(oldest) = self.sent.pop_front() {
            self.bytes -= oldest.data_in.len();
        }
    }

    /// How many statuses are kept, and their Data-In bytes.
    pub fn size(&self) -> (usize, usize) {
        (self.sent.len(), self.bytes)
    }

    /// The PDUs that answer `snack` (RFC 7143 11.16), or why none can:
    /// - Data SNACK (type 0) for a task's Data-In: the Data-In with DataSN
    ///   BegRun.. (RunLength of them, or all the rest for 0);
    /// - Status SNACK (type 1): the SCSI Responses with StatSN BegRun..;
    /// - anything for data or a status never sent or already acknowledged:
    ///   "Protocol Error" (11.16: "MUST be rejected"); a DataACK, which this
    ///   target never asks for: "Invalid DataACK"; an R-Data SNACK (asked
    ///   only after a task reassignment, ERL 2): "SNACK Reject".
    pub fn answer(&self, snack: &SnackRequest) -> Result<Vec<Resend<D>>, Refusal> {
        match snack.snack_type {
            SnackType::DataR2t => self.data(snack),
            SnackType::Status => self.statuses(snack),
            SnackType::DataAck => Err((
                RejectReason::InvalidDataAck,
                "DataACK SNACK, but no Data-In asked for one",
            )),
            SnackType::RData => Err((
                RejectReason::SnackReject,
                "R-Data SNACK: resegmentation follows a task reassignment (ERL 2)",
            )),
            SnackType::Other(_) => Err((RejectReason::ProtocolError, "SNACK of a reserved type")),
        }
    }

    fn data(&self, snack: &SnackRequest) -> Result<Vec<Resend<D>>, Refusal> {
        let itt = snack.initiator_task_tag;
        let Some(sent) = self
            .sent
            .iter()
            .find(|s| s.response.initiator_task_tag == itt)
        else {
            return Err((
                RejectReason::ProtocolError,
                "Data/R2T SNACK for a task with no unacknowledged data",
            ));
        };
        let segments = sent.limits.data_in_segments(sent.data_in.len() as u32);
        let count = segments.len() as u64;
        let first = u64::from(snack.beg_run);
        let end = match snack.run_length {
            0 => count,
            run => first + u64::from(run),
        };
        if first >= count || end > count {
            return Err((
                RejectReason::ProtocolError,
                "Data SNACK for DataSNs never sent",
            ));
        }
        Ok(segments[first as usize..end as usize]
            .iter()
            .map(|segment| {
                let (pdu, data) = sent.data_in(segment);
                Resend::DataIn(pdu, data)
            })
            .collect())
    }

    fn statuses(&self, snack: &SnackRequest) -> Result<Vec<Resend<D>>, Refusal> {
        let first = StatSn::new(snack.beg_run);
        let wanted = |sn: StatSn| match snack.run_length {
            0 => !sn.lt(first),
            run => {
                let offset = sn.get().wrapping_sub(first.get());
                !sn.lt(first) && offset < run
            }
        };
        let resends: Vec<Resend<D>> = self
            .sent
            .iter()
            .filter(|s| wanted(s.stat_sn))
            .map(|s| Resend::Response(s.response.clone(), s.sense_data.clone(), s.stat_sn))
            .collect();
        if resends.is_empty() {
            return Err((
                RejectReason::ProtocolError,
                "Status SNACK for statuses never sent or already acknowledged",
            ));
        }
        Ok(resends)
    }
}

/// The ExpStatSN an initiator PDU carries, if its format has one (RFC 7143
/// 11.3, 11.5, 11.7, 11.10, 11.14, 11.16, 11.18).
pub fn exp_stat_sn_of(pdu: &Pdu) -> Option<StatSn> {
    match pdu {
        Pdu::ScsiCommand(p) => Some(p.exp_stat_sn),
        Pdu::DataOut(p) => Some(p.exp_stat_sn),
        Pdu::NopOut(p) => Some(p.exp_stat_sn),
        Pdu::TaskManagementRequest(p) => Some(p.exp_stat_sn),
        Pdu::TextRequest(p) => Some(p.exp_stat_sn),
        Pdu::LogoutRequest(p) => Some(p.exp_stat_sn),
        Pdu::SnackRequest(p) => Some(p.exp_stat_sn),
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_send_segment: 8192,
            max_recv_segment: 8192,
            max_burst_length: 16384,
            first_burst_length: 8192,
            immediate_data: true,
            initial_r2t: true,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
        }
    }

    /// A status of task `itt` sent with StatSN `stat_sn` after `data_len`
    /// bytes of Data-In (also the orphan table's tests' answers).
    pub(crate) fn sent(itt: u32, stat_sn: u32, data_len: usize) -> SentStatus<Vec<u8>> {
        let bytes: Vec<u8> = (0..data_len).map(|i| i as u8).collect();
        SentStatus {
            stat_sn: StatSn::new(stat_sn),
            response: ScsiResponse {
                initiator_task_tag: itt,
                ..ScsiResponse::default()
            },
            sense_data: Vec::new(),
            data_in: bytes,
            lun: Lun(0),
            limits: limits(),
        }
    }

    fn snack(snack_type: SnackType, itt: u32, beg_run: u32, run_length: u32) -> SnackRequest {
        SnackRequest {
            snack_type,
            initiator_task_tag: itt,
            beg_run,
            run_length,
            ..SnackRequest::default()
        }
    }

    #[test]
    fn a_data_snack_gets_the_same_data_in_again() {
        let mut retained = Retained::<Vec<u8>>::default();
        retained.keep(sent(7, 100, 40_000));
        // 40 000 bytes in 16 KiB bursts of 8 KiB PDUs: DataSN 0-4.
        let resends = retained
            .answer(&snack(SnackType::DataR2t, 7, 1, 2))
            .unwrap();
        let placed: Vec<(u32, u32, usize, bool)> = resends
            .iter()
            .map(|r| match r {
                Resend::DataIn(pdu, data) => (
                    pdu.data_sn.get(),
                    pdu.buffer_offset,
                    data.len(),
                    pdu.final_flag,
                ),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(placed, [(1, 8192, 8192, true), (2, 16384, 8192, false)]);
        let Resend::DataIn(_, data) = &resends[0] else {
            unreachable!()
        };
        assert_eq!(data[0], (8192 % 256) as u8);
        // RunLength 0: everything from BegRun on.
        assert_eq!(
            retained
                .answer(&snack(SnackType::DataR2t, 7, 3, 0))
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn snacks_for_what_was_never_sent_are_protocol_errors() {
        let mut retained = Retained::<Vec<u8>>::default();
        retained.keep(sent(7, 100, 40_000));
        for bad in [
            snack(SnackType::DataR2t, 8, 0, 1),
            snack(SnackType::DataR2t, 7, 5, 0),
            snack(SnackType::DataR2t, 7, 4, 2),
            snack(SnackType::Status, RESERVED_TAG, 101, 1),
        ] {
            let (reason, _) = retained.answer(&bad).unwrap_err();
            assert_eq!(reason, RejectReason::ProtocolError, "{bad:?}");
        }
        let (reason, _) = retained
            .answer(&snack(SnackType::DataAck, 7, 0, 0))
            .unwrap_err();
        assert_eq!(reason, RejectReason::InvalidDataAck);
    }

    #[test]
    fn acknowledged_statuses_are_forgotten_and_memory_is_bounded() {
        let mut retained = Retained::<Vec<u8>>::default();
        for (i, sn) in (0..4).zip([u32::MAX - 1, u32::MAX, 0, 1]) {
            retained.keep(sent(i, sn, 100));
        }
        let statuses = retained
            .answer(&snack(SnackType::Status, RESERVED_TAG, u32::MAX, 2))
            .unwrap();
        let sns: Vec<u32> = statuses
            .iter()
            .map(|r| match r {
                Resend::Response(_, _, sn) => sn.get(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(sns, [u32::MAX, 0], "across the wrap");
        // ExpStatSN 0 acknowledges the two before it.
        retained.acknowledge(StatSn::new(0));
        assert_eq!(retained.size(), (2, 200));
        assert!(
            retained
                .answer(&snack(SnackType::DataR2t, 1, 0, 0))
                .is_err()
        );
        let big = RETAINED_BYTES / 3 + 1;
        for i in 10..14 {
            retained.keep(sent(i, i, big));
        }
        assert!(retained.size().1 <= RETAINED_BYTES);
        assert!(retained.evicted >= 2);
    }
}
