//! The transfer trackers driven by arbitrary operations: no panic, no
//! overflow, and a tracker that says complete has seen every byte exactly
//! once, counting Data-Out taken back after a digest error (ERL 1) and
//! asked for again with recovery R2Ts, and writes moved to a new
//! connection (ERL 2), whose missing ranges are exactly what did not
//! arrive.
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
        error_recovery_level: (flags >> 4) & 1,
    };
    let expected = word(data, 15) % 2_000_000;
    let immediate = limits.write_plan(expected).immediate;
    let Ok(mut tracker) = DataOutTracker::new(limits, expected, immediate) else {
        return;
    };
    let mut r2ts = R2tTracker::new(limits, expected).after_unsolicited(immediate);
    let mut received: u64 = u64::from(immediate);
    // The last Data-Out accepted: (tag, offset, length), for a discard.
    let mut last: Option<(u32, u32, u32)> = None;
    for op in data[19..].chunks_exact(17) {
        let tag = word(op, 1) % 4;
        let (a, b, c) = (word(op, 5), word(op, 9), word(op, 13));
        match op[0] % 6 {
            0 => tracker.r2t_sent(tag, a % (expected + 1), b % 300_000),
            1 => {
                let tag = if tag == 3 { u32::MAX } else { tag };
                let (offset, length) = (a % (expected + 1), b % 70_000);
                if tracker.data_out(tag, c % 8, offset, length, op[0] & 8 != 0).is_ok() {
                    received += u64::from(length);
                    last = Some((tag, offset, length));
                }
            }
            2 => {
                let _ = r2ts.r2t(c % 8, tag, a, b);
                let _ = (r2ts.awaits_r2t(), r2ts.next_r2t_sn(), r2ts.recoveries());
                if op[0] & 8 != 0 {
                    r2ts.answered(tag);
                }
            }
            3 => {
                // Its data failed the digest: taken back.
                if let Some((tag, offset, length)) = last.take() {
                    tracker.discard(tag, offset, length);
                    received -= u64::from(length);
                }
            }
            4 => {
                // The lost ranges asked for again with recovery R2Ts.
                for (offset, length) in tracker.take_lost() {
                    tracker.r2t_sent(tag, offset, length);
                }
            }
            _ => {
                // TASK REASSIGN: the missing ranges are in order, apart,
                // inside the transfer and add up to what did not arrive;
                // they are asked for on the new connection.
                last = None;
                r2ts.reassigned();
                let missing = tracker.reassigned();
                let mut end = 0u64;
                let mut total = 0u64;
                for &(offset, length) in &missing {
                    assert!(length > 0 && u64::from(offset) >= end);
                    end = u64::from(offset) + u64::from(length);
                    total += u64::from(length);
                }
                assert!(end <= u64::from(expected));
                assert_eq!(total + received, u64::from(expected));
                for (offset, length) in missing {
                    tracker.r2t_sent(tag, offset, length);
                }
            }
        }
    }
    if tracker.is_complete() {
        assert_eq!(received, u64::from(expected));
    }
});
