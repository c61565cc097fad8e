//! The transfer trackers driven by arbitrary operations: no panic, no
//! overflow, and a tracker that says complete has seen every byte exactly
//! once.
#![no_main]

use iscsi_proto::transfer::{DataOutTracker, Limits, R2tTracker};
use libfuzzer_sys::fuzz_target;

fn word(bytes: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    for (i, b) in w.iter_mut().enumerate() {
        *b = bytes.get(at + i).copied().unwrap_or(0);
    }
    u32::from_le_bytes(w)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 19 {
        return;
    }
    let flags = data[0];
    let limits = Limits {
        max_send_segment: 512 + word(data, 1) % 70_000,
        max_recv_segment: 512 + word(data, 5) % 70_000,
        max_burst_length: 512 + word(data, 9) % 300_000,
        first_burst_length: 512 + u32::from(data[13]) * 1024,
        immediate_data: flags & 1 != 0,
        initial_r2t: flags & 2 != 0,
        max_outstanding_r2t: u16::from(data[14] % 4) + 1,
        data_pdu_in_order: flags & 4 != 0,
        data_sequence_in_order: flags & 8 != 0,
    };
    let expected = word(data, 15) % 2_000_000;
    let immediate = limits.write_plan(expected).immediate;
    let Ok(mut tracker) = DataOutTracker::new(limits, expected, immediate) else {
        return;
    };
    let mut r2ts = R2tTracker::new(limits, expected);
    let mut received: u64 = u64::from(immediate);
    for op in data[19..].chunks_exact(17) {
        let tag = word(op, 1) % 4;
        let (a, b, c) = (word(op, 5), word(op, 9), word(op, 13));
        match op[0] % 3 {
            0 => tracker.r2t_sent(tag, a % (expected + 1), b % 300_000),
            1 => {
                let tag = if tag == 3 { u32::MAX } else { tag };
                if tracker.data_out(tag, c % 8, a % (expected + 1), b % 70_000, op[0] & 8 != 0).is_ok() {
                    received += u64::from(b % 70_000);
                }
            }
            _ => {
                let _ = r2ts.r2t(c % 8, tag, a, b);
            }
        }
    }
    if tracker.is_complete() {
        assert_eq!(received, u64::from(expected));
    }
});
