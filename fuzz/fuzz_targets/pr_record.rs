//! The shared persistent reservation record (`iscsi_scsi::pr_record`), as a
//! gateway reads it from a RADOS object another gateway (or anything with
//! write access to the pool) wrote: any bytes are either refused with an
//! error or are a record that encodes back to exactly those bytes, within
//! the limits on registrations and gateways; never a panic.
#![no_main]

use iscsi_scsi::pr_record::{MAX_GATEWAYS, MAX_REGISTRATIONS, PrRecord};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(record) = PrRecord::decode(data) {
        assert!(record.registration_count() <= MAX_REGISTRATIONS);
        assert!(record.gateways.len() <= MAX_GATEWAYS);
        assert_eq!(record.encode(), data);
    }
});
