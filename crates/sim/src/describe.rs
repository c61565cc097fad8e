//! One line per PDU for the event trace: what a reader of a failing
//! seed's trace needs to follow a task (tags, sequence numbers, offsets).

use iscsi_proto::pdu::Pdu;

/// One line for a PDU in the trace.
pub fn describe(pdu: &Pdu) -> String {
    match pdu {
        Pdu::ScsiCommand(c) => format!(
            "{} itt {} cmdsn {} len {}{}",
            if c.write { "WRITE" } else { "READ" },
            c.initiator_task_tag,
            c.cmd_sn.get(),
            c.expected_data_transfer_length,
            if c.immediate { " (immediate)" } else { "" }
        ),
        Pdu::DataOut(d) => format!(
            "Data-Out itt {} ttt {:#x} datasn {} off {}{}",
            d.initiator_task_tag,
            d.target_transfer_tag,
            d.data_sn.get(),
            d.buffer_offset,
            if d.final_flag { " F" } else { "" }
        ),
        Pdu::ReadyToTransfer(r) => format!(
            "R2T itt {} ttt {:#x} r2tsn {} {}+{} statsn {}",
            r.initiator_task_tag,
            r.target_transfer_tag,
            r.r2t_sn.get(),
            r.buffer_offset,
            r.desired_data_transfer_length,
            r.stat_sn.get()
        ),
        Pdu::DataIn(d) => format!(
            "Data-In itt {} datasn {} off {}{}",
            d.initiator_task_tag,
            d.data_sn.get(),
            d.buffer_offset,
            if d.final_flag { " F" } else { "" }
        ),
        Pdu::ScsiResponse(r) => format!(
            "Response itt {} status {:#x} statsn {} maxcmdsn {}",
            r.initiator_task_tag,
            r.status,
            r.stat_sn.get(),
            r.max_cmd_sn.get()
        ),
        Pdu::TaskManagementRequest(t) => format!(
            "ABORT TASK itt {} of {}",
            t.initiator_task_tag, t.referenced_task_tag
        ),
        Pdu::TaskManagementResponse(t) => format!(
            "TMF response itt {} {:?} statsn {}",
            t.initiator_task_tag,
            t.response,
            t.stat_sn.get()
        ),
        Pdu::SnackRequest(s) => format!(
            "SNACK {:?} itt {} from {} x{}",
            s.snack_type, s.initiator_task_tag, s.beg_run, s.run_length
        ),
        Pdu::Reject(r) => format!("Reject {:?} statsn {}", r.reason, r.stat_sn.get()),
        other => format!("{other:?}"),
    }
}
