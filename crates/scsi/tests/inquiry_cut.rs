//! INQUIRY cut by its ALLOCATION LENGTH (SPC-4 §4.2.5.6): the first
//! ALLOCATION LENGTH bytes of the whole answer, whose length fields still
//! give the whole length; never an error, never a differently built
//! answer. Checked for the standard data and every VPD page, every length
//! from 0 to past the end.

mod common;

use common::*;
use iscsi_scsi::spc::SUPPORTED_VPD_PAGES;

fn inquiry(evpd: bool, page: u8, alloc: u16) -> Vec<u8> {
    let [hi, lo] = alloc.to_be_bytes();
    vec![0x12, u8::from(evpd), page, hi, lo, 0]
}

#[test]
fn every_page_cut_short_is_a_prefix_of_the_whole_page() {
    let (t, _) = ram_target(1 << 20, 512);
    let n = nexus(1);
    let mut pages: Vec<(bool, u8)> = vec![(false, 0)];
    pages.extend(SUPPORTED_VPD_PAGES.iter().map(|&p| (true, p)));
    for (evpd, page) in pages {
        let whole = good(&t, &n, &inquiry(evpd, page, u16::MAX), &[]);
        // The length field covers exactly what follows it.
        if evpd {
            assert_eq!(whole[1], page);
            let len = usize::from(u16::from_be_bytes([whole[2], whole[3]]));
            assert_eq!(len + 4, whole.len(), "page {page:#04x}");
        } else {
            assert_eq!(usize::from(whole[4]) + 5, whole.len());
        }
        for alloc in 0..=whole.len() + 8 {
            let alloc16 = u16::try_from(alloc).unwrap();
            let cut = good(&t, &n, &inquiry(evpd, page, alloc16), &[]);
            assert_eq!(
                cut,
                whole[..alloc.min(whole.len())],
                "page {page:#04x} (evpd {evpd}) cut to {alloc}"
            );
        }
    }
}

/// The designation descriptors of page 83h fill the page exactly: a cut
/// answer's PAGE LENGTH is that of the whole, so an initiator that reads
/// the page again with it gets every descriptor whole.
#[test]
fn device_identification_descriptors_tile_the_page() {
    let (t, _) = ram_target(1 << 20, 512);
    let n = nexus(1);
    let whole = good(&t, &n, &inquiry(true, 0x83, u16::MAX), &[]);
    let mut i = 4;
    let mut count = 0;
    while i < whole.len() {
        assert!(i + 4 <= whole.len(), "descriptor header cut at {i}");
        i += 4 + usize::from(whole[i + 3]);
        count += 1;
    }
    assert_eq!(i, whole.len());
    assert_eq!(count, 4);
    // A 4-byte answer is the header alone, PAGE LENGTH whole.
    let head = good(&t, &n, &inquiry(true, 0x83, 4), &[]);
    assert_eq!(head, whole[..4]);
}

/// The NAA 6 designator carries the configured IEEE company ID after the
/// NAA nibble, and the store's unique id as its extension.
#[test]
fn the_naa_designator_carries_the_company_id() {
    use std::sync::Arc;

    use iscsi_scsi::{Backstore, ScsiTarget, TargetIdentity, spc};
    use iscsi_stores::RamBackstore;
    let ram: Arc<dyn Backstore> = Arc::new(RamBackstore::new(1 << 20, 512, 0x1234).unwrap());
    let mut id = TargetIdentity::new("iqn.2026-01.rs.iscsi:t");
    assert_eq!(id.naa_company_id, spc::NAA_COMPANY_ID);
    id.naa_company_id = 0xAB_CDEF;
    let t = ScsiTarget::new(id, vec![ram]);
    let page = good(&t, &nexus(1), &inquiry(true, 0x83, 255), &[]);
    assert_eq!(&page[4..8], &[0x01, 0x03, 0x00, 16]);
    assert_eq!(&page[8..12], &[0x6A, 0xBC, 0xDE, 0xF0]);
    assert_eq!(&page[16..24], &0x1234u64.to_be_bytes());
    assert_eq!(
        spc::naa_designator(0x00_1405, 1)[..4],
        [0x60, 0x01, 0x40, 0x50],
        "LIO's company ID, laid out as LIO lays it out"
    );
}
