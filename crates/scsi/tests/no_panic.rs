//! Property: no CDB, LUN or Data-Out from the network panics, and every
//! CHECK CONDITION carries sense (GOOD never does).

use std::sync::Arc;

use iscsi_scsi::{Backstore, RamBackstore, ScsiTarget, TargetIdentity, command_info, status};
use proptest::prelude::*;

const KNOWN: [u8; 19] = [
    0x00, 0x03, 0x08, 0x0A, 0x12, 0x1A, 0x25, 0x28, 0x2A, 0x35, 0x42, 0x5A, 0x88, 0x8A, 0x91, 0x9E,
    0xA0, 0xA8, 0xAA,
];

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

fn cdb() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..32),
        (
            prop::sample::select(&KNOWN[..]),
            prop::collection::vec(any::<u8>(), 0..31)
        )
            .prop_map(|(op, mut rest)| {
                rest.insert(0, op);
                rest
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn no_cdb_panics(lun in lun(), cdb in cdb(), data_out in prop::collection::vec(any::<u8>(), 0..1100)) {
        let t = target();
        let _ = command_info(&cdb, 512);
        let _ = command_info(&cdb, 4096);
        let mut data_in = Vec::new();
        let o = t.execute(lun, &cdb, &data_out, &mut data_in);
        match o.status {
            status::GOOD => prop_assert!(o.sense.is_none()),
            status::CHECK_CONDITION => {
                prop_assert!(o.sense.is_some());
                prop_assert!(data_in.is_empty());
            }
            other => prop_assert!(false, "unexpected status {other:#x}"),
        }
        prop_assert!(data_in.len() <= 8 * 1024 * 1024);
    }
}
