//! The EXTENDED COPY (LID1) parameter list parser, then the whole command:
//! each input is a parameter list, parsed on its own (no panic, never more
//! descriptors than the operating parameters allow) and then sent as an
//! EXTENDED COPY to a target with two small RAM LUs (unique ids 1 and 2,
//! whose NAA designators the seeds in `fuzz/seeds/xcopy_parameters` name).
//! Every outcome is GOOD, CHECK CONDITION with sense or RESERVATION
//! CONFLICT; memory stays bounded however large the lengths claim to be.
#![no_main]

use std::sync::Arc;

use iscsi_scsi::xcopy::{self, parse};
use iscsi_scsi::{Backstore, Nexus, ScsiTarget, TargetIdentity, status};
use iscsi_stores::{RamBackstore};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(list)) = parse::parse(data) {
        assert!(list.cscds.len() <= usize::from(xcopy::MAX_CSCD_DESCRIPTORS));
        assert!(list.segments.len() <= usize::from(xcopy::MAX_SEGMENT_DESCRIPTORS));
        for s in &list.segments {
            assert!(usize::from(s.src) < list.cscds.len());
            assert!(usize::from(s.dst) < list.cscds.len());
        }
    }
    let luns: Vec<Arc<dyn Backstore>> = (1..=2)
        .filter_map(|id| RamBackstore::new(1 << 20, 512, id).ok())
        .map(|s| Arc::new(s) as Arc<dyn Backstore>)
        .collect();
    let target = ScsiTarget::new(TargetIdentity::new("iqn.2026-11.rs.iscsi:fuzz"), luns);
    let nexus = Nexus::iscsi("iqn.2026-11.rs.iscsi:a", 1, 1);
    let mut cdb = [0u8; 16];
    cdb[0] = 0x83;
    cdb[10..14].copy_from_slice(&u32::try_from(data.len()).unwrap_or(u32::MAX).to_be_bytes());
    let mut data_in = Vec::new();
    let outcome = target.execute(&nexus, 0, &cdb, data, &mut data_in);
    match outcome.status {
        status::GOOD | status::RESERVATION_CONFLICT => assert!(outcome.sense.is_none()),
        status::CHECK_CONDITION => assert!(outcome.sense.is_some()),
        other => panic!("status {other:#x}"),
    }
    assert!(data_in.is_empty());
});
