//! [`WithOptions`]: any store, with the options of the LU it is the medium
//! of. A LUN specification's `readonly`, `removable` and
//! `physical-block=SIZE` apply to every kind of store alike, so they wrap
//! the store instead of each store learning them; the SCSI layer reads them
//! once, when it makes the LU ([`Backstore::lu_options`]).

use std::sync::Arc;

use iscsi_scsi::LuOptions;
use iscsi_scsi::backstore::Backstore;

/// `inner`, reporting `options`; every access goes straight through.
#[derive(Debug)]
pub struct WithOptions {
    inner: Arc<dyn Backstore>,
    options: LuOptions,
}

impl WithOptions {
    /// `inner` with `options`. The error says why the options do not suit
    /// the store (a physical block size that is not a power-of-two
    /// multiple of its logical block size).
    pub fn new(inner: Arc<dyn Backstore>, options: LuOptions) -> Result<Self, String> {
        options.check(inner.block_size())?;
        Ok(WithOptions { inner, options })
    }
}

impl Backstore for WithOptions {
    // Every access goes straight through, and what the store promises or
    // offers stays what it is under options: atomic writes, block and
    // cryptographic erase, its file for `copy_file_range`.
    delegate!(inner =>
        block_size, block_count, read_at, write_at, lend, write_pieces, write_pieces_through,
        flush, unmap, unique_id, write_through, is_thin, may_block, async_io, unmap_granularity,
        allocation_status, atomic_write_max, can_block_erase, can_crypto_erase, crypto_erase,
        file, copy_from, compare_and_write, write_same, take_capacity_change, resize,
        shared_pr,
        alua, snapshots,
    );

    fn lu_options(&self) -> LuOptions {
        self.options
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RamBackstore;

    #[test]
    fn options_are_reported_and_checked_against_the_block_size() {
        let ram: Arc<dyn Backstore> = Arc::new(RamBackstore::new(1 << 20, 512, 7).unwrap());
        let options = LuOptions {
            read_only: true,
            physical_block_size: Some(4096),
            ..LuOptions::DEFAULT
        };
        let with = WithOptions::new(ram.clone(), options).unwrap();
        assert_eq!(with.lu_options(), options);
        assert_eq!(ram.lu_options(), LuOptions::DEFAULT);
        assert_eq!((with.block_size(), with.unique_id()), (512, 7));
        with.write_at(0, &[1; 512]).unwrap();
        let mut back = [0; 512];
        ram.read_at(0, &mut back).unwrap();
        assert_eq!(back, [1; 512]);
        let odd = LuOptions {
            physical_block_size: Some(1536),
            ..LuOptions::DEFAULT
        };
        assert!(WithOptions::new(ram, odd).is_err());
    }

    #[test]
    fn what_the_store_offers_passes_through() {
        let ram: Arc<dyn Backstore> = Arc::new(RamBackstore::new(1 << 20, 512, 7).unwrap());
        let removable = LuOptions {
            removable: true,
            ..LuOptions::DEFAULT
        };
        let with = WithOptions::new(Arc::clone(&ram), removable).unwrap();
        assert!(with.atomic_write_max() > 0);
        assert_eq!(with.atomic_write_max(), ram.atomic_write_max());
        assert_eq!(with.can_block_erase(), ram.can_block_erase());
        assert!(with.can_block_erase());
        // A copy into it reaches the store.
        let src: Arc<dyn Backstore> = Arc::new(RamBackstore::new(1 << 20, 512, 8).unwrap());
        src.write_at(0, &[9; 512]).unwrap();
        with.copy_from(src.as_ref(), 0, 512, 512).unwrap();
        let mut back = [0; 512];
        ram.read_at(512, &mut back).unwrap();
        assert_eq!(back, [9; 512]);
        let path =
            std::env::temp_dir().join(format!("iscsi-rs-options-{}.img", std::process::id()));
        let file: Arc<dyn Backstore> =
            Arc::new(crate::FileBackstore::open(&path, Some(1 << 20), 512, 9).unwrap());
        let with_file = WithOptions::new(file, removable).unwrap();
        assert!(
            with_file.file().is_some(),
            "copy_file_range still sees the file"
        );
        let _ = std::fs::remove_file(&path);
    }
}
