//! The shared persistent reservation record (`iscsi_scsi::pr_record`), as a
//! gateway reads it from a RADOS object another gateway (or anything with
//! write access to the pool) wrote: any bytes are either refused with an
//! error or are a record that encodes back to exactly those bytes, within
//! the limits on registrations and gateways; never a panic. Seeds: a
//! version 1 record, and a version 2 one (an SPC-2 holder, resets, mode
//! parameters).
#![no_main]

use iscsi_scsi::pr_record::{MAX_GATEWAYS, MAX_REGISTRATIONS, PrRecord};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(record) = PrRecord::decode(data) {
        assert!(record.registration_count() <= MAX_REGISTRATIONS);
        assert!(record.gateways.len() <= MAX_GATEWAYS);
        // No reset, no reset's unit attention (version 2's canonical form).
        assert!(record.resets != 0 || record.reset_ascq == 0);
        assert_eq!(record.encode(), data);
    }
});
