//! The fault proxy's parsing on arbitrary input: a fault specification (up
//! to the first newline) and then a byte stream from a "target", framed as
//! the proxy frames it (digests switched on by whatever login text the
//! stream holds) with every fault that fires applied. No panic, no hang,
//! no allocation driven by a length field, and a corruption changes
//! exactly one byte inside the PDU.
#![no_main]

use iscsi_fault::framing::{Layout, LoginWatch, corrupt};
use iscsi_fault::plan::Plan;
use iscsi_fault::{Action, Direction, Fault};
use iscsi_proto::pdu::{BHS_LEN, Pdu};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let split = data.iter().position(|&b| b == b'\n').unwrap_or(data.len());
    let (spec, stream) = data.split_at(split);
    let faults: Vec<Fault> = std::str::from_utf8(spec)
        .ok()
        .and_then(|text| text.parse().ok())
        .into_iter()
        .collect();
    let plan = Plan::new(faults);
    let mut watch = LoginWatch::default();
    let mut pos = 0;
    let mut pdus = 0;
    while pos + BHS_LEN <= stream.len() && pdus < 10_000 {
        pdus += 1;
        let bhs: &[u8; BHS_LEN] = stream[pos..pos + BHS_LEN].try_into().unwrap();
        let layout = Layout::of(bhs, watch.digests());
        let end = pos.saturating_add(layout.wire_len());
        let Some(wire) = stream.get(pos..end) else {
            break;
        };
        let (pdu, _) = Pdu::decode_bhs(bhs);
        let data = &wire[layout.header_len..layout.header_len + layout.data_len];
        watch.observe_from_target(&pdu, data);
        for firing in plan.on_pdu(Direction::ToInitiator, pdu.opcode(), layout.data_len) {
            if let Action::CorruptHeader { .. } | Action::CorruptData { .. } = firing.action {
                let mut copy = wire.to_vec();
                if corrupt(&mut copy, layout, firing.action).is_some() {
                    let changed = copy.iter().zip(wire).filter(|(a, b)| a != b).count();
                    assert_eq!(changed, 1);
                }
            }
        }
        pos = end;
    }
});
