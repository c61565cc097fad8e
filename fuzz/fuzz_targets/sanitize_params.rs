//! SANITIZE OVERWRITE's parameter list (`OverwriteParams::parse`) on
//! arbitrary bytes and block sizes: it never panics, and what it accepts
//! is what SBC-4 allows (1 to 31 passes, TEST 0, a pattern of 1 to one
//! block, exactly the bytes after the header).
#![no_main]

use iscsi_scsi::sanitize::OverwriteParams;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&shift, list)) = data.split_first() else {
        return;
    };
    // 512 to 65536: the block sizes a store may have.
    let block_size = 512u32 << (shift % 8);
    if let Ok(p) = OverwriteParams::parse(list, block_size) {
        assert!((1..=31).contains(&p.count));
        assert!(!p.pattern.is_empty());
        assert!(p.pattern.len() <= block_size as usize);
        assert_eq!(p.pattern.len() + 4, list.len());
        assert_eq!(list[0] & 0x60, 0);
    }
});
