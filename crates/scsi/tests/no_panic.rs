//! Property: no CDB, LUN, nexus, Data-Out or sequence of commands from the
//! network panics; every CHECK CONDITION carries sense (GOOD and
//! RESERVATION CONFLICT never do) and leaves Data-In empty; Data-In never
//! exceeds the largest transfer.

use std::sync::Arc;

use iscsi_scsi::opcodes::COMMANDS;
use iscsi_scsi::{
    Backstore, CommandOutcome, Nexus, ScsiTarget, TargetIdentity, command_info, status,
};
use iscsi_stores::RamBackstore;
use proptest::prelude::*;

fn target() -> ScsiTarget {
    let luns: Vec<Arc<dyn Backstore>> = vec![
        Arc::new(RamBackstore::new(1 << 20, 512, 1).unwrap()),
        Arc::new(RamBackstore::new(1 << 20, 4096, 2).unwrap()),
    ];
    ScsiTarget::new(TargetIdentity::new("iqn.2026-01.rs.iscsi:p"), luns)
}

fn lun() -> impl Strategy<Value = u64> {
    prop_oneof![
        (0u64..4).prop_map(|n| n << 48),
        (0u64..4).prop_map(|n| (0x4000 | n) << 48),
        any::<u64>(),
    ]
}

fn known_opcodes() -> Vec<u8> {
    let mut ops: Vec<u8> = COMMANDS.iter().map(|c| c.opcode).collect();
    ops.dedup();
    ops
}

/// Arbitrary bytes, or a known opcode (with a known service action half the
/// time) followed by arbitrary bytes, with small counts and lengths favoured.
fn cdb() -> impl Strategy<Value = Vec<u8>> {
    let ops = known_opcodes();
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..32),
        (
            prop::sample::select(ops),
            prop::collection::vec(any::<u8>(), 0..31)
        )
            .prop_map(|(op, mut rest)| {
                rest.insert(0, op);
                rest
            }),
        (
            prop::sample::select(COMMANDS),
            prop::collection::vec(prop_oneof![Just(0u8), Just(1), Just(24), any::<u8>()], 15),
        )
            .prop_map(|(c, rest)| {
                let mut cdb = vec![c.opcode];
                cdb.extend_from_slice(&rest);
                if let (Some(sa), Some(b1)) = (c.service_action, cdb.get_mut(1)) {
                    *b1 = (*b1 & 0xE0) | sa;
                }
                cdb.truncate(c.usage.len());
                cdb
            }),
    ]
}

fn nexus() -> impl Strategy<Value = Nexus> {
    (0u64..3).prop_map(|i| Nexus::iscsi("iqn.2026-01.rs.iscsi:i", i, 1))
}

fn data_out() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..1100),
        prop::collection::vec(prop_oneof![Just(0u8), any::<u8>()], 0..9000),
    ]
}

fn check_outcome(o: &CommandOutcome, data_in: &[u8]) -> Result<(), TestCaseError> {
    match o.status {
        status::GOOD | status::RESERVATION_CONFLICT => prop_assert!(o.sense.is_none()),
        status::CHECK_CONDITION => {
            prop_assert!(o.sense.is_some());
            prop_assert!(data_in.is_empty());
            prop_assert!(!o.sense_bytes().is_empty());
        }
        other => prop_assert!(false, "unexpected status {other:#x}"),
    }
    if o.status == status::RESERVATION_CONFLICT {
        prop_assert!(data_in.is_empty());
    }
    prop_assert!(data_in.len() <= 32 * 1024 * 1024);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn no_cdb_panics(nexus in nexus(), lun in lun(), cdb in cdb(), data_out in data_out()) {
        let t = target();
        let _ = command_info(&cdb, 512);
        let _ = command_info(&cdb, 4096);
        let mut data_in = Vec::new();
        let o = t.execute(&nexus, lun, &cdb, &data_out, &mut data_in);
        check_outcome(&o, &data_in)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Sequences of commands from several nexuses, with resets and nexus
    /// losses in between, reach reservation and mode states a single
    /// command cannot.
    #[test]
    fn no_sequence_panics(
        steps in prop::collection::vec(
            (nexus(), 0u64..2, cdb(), data_out(), 0u8..20),
            1..24,
        )
    ) {
        let t = target();
        let mut data_in = Vec::new();
        for (nexus, lun, cdb, data_out, event) in steps {
            match event {
                0 => t.lun_reset(lun as u16),
                1 => t.nexus_lost(&nexus),
                2 => t.target_reset(iscsi_scsi::TargetReset::Warm),
                _ => {}
            }
            let o = t.execute(&nexus, lun << 48, &cdb, &data_out, &mut data_in);
            check_outcome(&o, &data_in)?;
        }
    }
}
