//! The SCSI target core on arbitrary command sequences: each input is cut
//! into commands (a CDB and its Data-Out) sent from two I_T nexuses to a
//! small RAM LU and to a LUN that does not exist. Nothing panics, every
//! outcome is GOOD, CHECK CONDITION with sense or RESERVATION CONFLICT, and
//! Data-In never exceeds what the CDB's allocation/transfer length allows
//! (the transport bounds that, and libFuzzer's malloc limit catches any
//! allocation that is not bounded by it).
#![no_main]

use std::sync::Arc;

use iscsi_scsi::{Backstore, Nexus, ScsiTarget, TargetIdentity, TargetReset, command_info, encode_lun, status};
use iscsi_stores::{RamBackstore};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(store) = RamBackstore::new(2 << 20, 512, 1) else {
        return;
    };
    let target = ScsiTarget::new(
        TargetIdentity::new("iqn.2026-11.rs.iscsi:fuzz"),
        vec![Arc::new(store) as Arc<dyn Backstore>],
    );
    let nexuses = [
        Nexus::iscsi("iqn.2026-11.rs.iscsi:a", 1, 1),
        Nexus::iscsi("iqn.2026-11.rs.iscsi:b", 2, 1),
    ];
    let mut data_in = Vec::new();
    let mut rest = data;
    // Each command: [flags, cdb_len, cdb..., out_len_lo, out_len_hi, out...]
    while let [flags, cdb_len, tail @ ..] = rest {
        let cdb_len = usize::from(*cdb_len % 17);
        let Some((cdb, tail)) = tail.split_at_checked(cdb_len) else {
            return;
        };
        let [lo, hi, tail @ ..] = tail else {
            return;
        };
        let out_len = usize::from(u16::from_le_bytes([*lo, *hi])).min(tail.len());
        let (data_out, tail) = tail.split_at(out_len);
        rest = tail;
        let nexus = &nexuses[usize::from(flags & 1)];
        let lun = if flags & 2 == 0 { encode_lun(0) } else { encode_lun(3) };
        match flags >> 5 {
            6 => target.lun_reset(0),
            7 => target.target_reset(TargetReset::Warm),
            5 => target.nexus_lost(nexus),
            _ => {}
        }
        let outcome = target.execute(nexus, lun, cdb, data_out, &mut data_in);
        match outcome.status {
            status::GOOD => assert!(outcome.sense.is_none()),
            status::CHECK_CONDITION => {
                assert!(outcome.sense.is_some());
                assert!(data_in.is_empty());
            }
            status::RESERVATION_CONFLICT => assert!(data_in.is_empty()),
            other => panic!("status {other:#x}"),
        }
        let (_, allowed) = command_info(cdb, 512);
        assert!(
            data_in.len() <= (allowed as usize).max(36 + 252),
            "{} bytes of Data-In for a CDB allowing {allowed}",
            data_in.len()
        );
    }
});
