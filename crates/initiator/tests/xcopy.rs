//! EXTENDED COPY end to end (issue 38): two targets in one server, our
//! initiator library sending the raw CDBs. A copy between two LUNs of the
//! same target copies exactly; one that names the other target's LU (the
//! hole of Linux's CVE-2020-28374), an LU removed by a reload, or an LU
//! reserved through another I_T nexus is refused and moves nothing.
//!
//! (Here rather than in `crates/iscsi-target/tests`: this crate's tests
//! already run `iscsi target` in process behind the initiator library.)

mod common;

use std::sync::Arc;

use common::start_from_toml as start;
use iscsi_initiator::{Command, IscsiUrl, Response, Session, SessionConfig};
use iscsi_target::ParsedConfig;
use iscsi_test_peers::free_port;

const A: &str = "iqn.2026-11.rs.iscsi:xcopy-a";
const B: &str = "iqn.2026-11.rs.iscsi:xcopy-b";
const BLOCK: u32 = 512;
/// Blocks each copy moves: 1 MiB, more than one RAM chunk.
const BLOCKS: u16 = 2048;

fn file(port: u16, a_luns: &str) -> String {
    format!(
        "listen = [\"127.0.0.1:{port}\"]\nnop_in_interval_seconds = 0\n\
         [[target]]\nname = \"{A}\"\n[target.lun]\n{a_luns}\n\
         [[target]]\nname = \"{B}\"\n[target.lun]\n0 = \"ram:8M\"\n"
    )
}

const THREE: &str = "0 = \"ram:8M\"\n1 = \"ram:8M\"\n2 = \"ram:8M\"";

async fn connect(port: u16, target: &str, isid: u8) -> Arc<Session> {
    let url: IscsiUrl = format!("iscsi://127.0.0.1:{port}/{target}/0")
        .parse()
        .unwrap();
    let config = SessionConfig {
        initiator_name: "iqn.2026-11.rs.iscsi:xcopy-client".to_owned(),
        isid: Some([0x80, 0, 0, 0, 0, isid]),
        ..SessionConfig::default()
    };
    Arc::new(Session::connect(&url, config).await.expect("login"))
}

/// The NAA designator VPD page 83h reports for `lun`.
async fn naa(session: &Session, lun: u64) -> [u8; 16] {
    let page = session.inquiry_vpd(lun, 0x83).await.expect("VPD 83h");
    assert_eq!(&page[4..8], &[0x01, 0x03, 0x00, 16], "NAA first");
    page[8..24].try_into().unwrap()
}

/// An EXTENDED COPY (LID1) parameter list, list identifier `id` held for
/// COPY STATUS: identification CSCDs for `ids`, one block to block segment
/// of [`BLOCKS`] from CSCD 0 at `src_lba` to CSCD 1 at `dst_lba`.
fn parameters(id: u8, ids: [[u8; 16]; 2], src_lba: u64, dst_lba: u64) -> Vec<u8> {
    let mut v = vec![0u8; 16];
    v[0] = id;
    v[2..4].copy_from_slice(&64u16.to_be_bytes());
    v[8..12].copy_from_slice(&28u32.to_be_bytes());
    for d in ids {
        let mut c = [0u8; 32];
        c[0] = 0xE4;
        c[4..8].copy_from_slice(&[0x01, 0x03, 0x00, 16]);
        c[8..24].copy_from_slice(&d);
        c[28..32].copy_from_slice(&BLOCK.to_be_bytes());
        v.extend_from_slice(&c);
    }
    let mut s = [0u8; 28];
    s[0] = 0x02;
    s[2..4].copy_from_slice(&24u16.to_be_bytes());
    s[6..8].copy_from_slice(&1u16.to_be_bytes());
    s[10..12].copy_from_slice(&BLOCKS.to_be_bytes());
    s[12..20].copy_from_slice(&src_lba.to_be_bytes());
    s[20..28].copy_from_slice(&dst_lba.to_be_bytes());
    v.extend_from_slice(&s);
    v
}

/// Sends EXTENDED COPY to LUN `lun`, retrying once past a unit attention
/// (a reload's REPORTED LUNS DATA HAS CHANGED).
async fn xcopy(session: &Session, lun: u64, data: &[u8]) -> Response {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x83;
    cdb[10..14].copy_from_slice(&u32::try_from(data.len()).unwrap().to_be_bytes());
    for _ in 0..2 {
        let r = session
            .execute(Command::write(lun, &cdb, data))
            .await
            .expect("EXTENDED COPY answered");
        if r.sense().is_none_or(|s| s.key != 0x06) {
            return r;
        }
    }
    panic!("unit attentions do not stop");
}

/// RECEIVE COPY RESULTS, COPY STATUS of list `id`, from the LU (copy
/// manager) the copy was sent to.
async fn copy_status(session: &Session, lun: u64, id: u8) -> Response {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x84;
    cdb[2] = id;
    cdb[10..14].copy_from_slice(&64u32.to_be_bytes());
    session
        .execute(Command::read(lun, &cdb, vec![0; 64]))
        .await
        .expect("RECEIVE COPY RESULTS answered")
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..usize::from(BLOCKS) * BLOCK as usize)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

async fn read(session: &Session, lun: u64, lba: u64) -> Vec<u8> {
    let buffer = vec![0; usize::from(BLOCKS) * BLOCK as usize];
    session.read(lun, lba, BLOCK, buffer).await.expect("READ")
}

/// COPY ABORTED / COPY TARGET DEVICE NOT REACHABLE.
fn unreachable(r: &Response) -> bool {
    r.status == 0x02
        && r.sense()
            .is_some_and(|s| (s.key, s.asc, s.ascq) == (0x0A, 0x0D, 0x02))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_stay_inside_the_issuing_target() {
    let port = free_port();
    let (handle, _stop) = start(&file(port, THREE)).await;
    let a = connect(port, A, 1).await;
    let other = connect(port, A, 2).await;
    let b = connect(port, B, 3).await;
    let (a0, a1, a2) = (naa(&a, 0).await, naa(&a, 1).await, naa(&a, 2).await);
    let b0 = naa(&b, 0).await;
    assert!(
        a0 != b0 && a1 != b0,
        "designators are unique across targets"
    );
    let data = pattern(0x5A);
    a.write(0, 8, BLOCK, &data).await.unwrap();
    b.write(0, 0, BLOCK, &pattern(0xB0)).await.unwrap();
    let zeros = vec![0u8; data.len()];

    // A good copy between two LUNs of target A, sent to a third.
    let r = xcopy(&a, 2, &parameters(1, [a0, a1], 8, 100)).await;
    assert_eq!(r.status, 0x00, "{:?}", r.sense());
    assert!(read(&a, 1, 100).await == data, "copied exactly");
    assert!(
        read(&a, 1, 100 - 1).await[..512] == [0; 512],
        "nothing before"
    );
    let status = copy_status(&a, 2, 1).await;
    assert_eq!(status.status, 0x00);
    assert_eq!(&status.data[..12], &[0, 0, 0, 8, 1, 0, 1, 0, 0, 0x10, 0, 0]);

    // Target B's LU named from target A: unreachable either way, and
    // nothing moves.
    let r = xcopy(&a, 0, &parameters(2, [a0, b0], 8, 0)).await;
    assert!(unreachable(&r), "{:?}", r.sense());
    assert!(read(&b, 0, 0).await == pattern(0xB0), "B untouched");
    let r = xcopy(&a, 0, &parameters(3, [b0, a1], 0, 5000)).await;
    assert!(unreachable(&r), "{:?}", r.sense());
    assert!(
        read(&a, 1, 5000).await == zeros,
        "B's data did not leak into A"
    );
    // And from B's side, A's LUs are as unknown.
    let r = xcopy(&b, 0, &parameters(4, [a0, b0], 8, 0)).await;
    assert!(unreachable(&r), "{:?}", r.sense());
    assert!(read(&b, 0, 0).await == pattern(0xB0), "B untouched");

    // Another nexus reserves LU 2: copying into or out of it conflicts.
    let reserve = [0x16, 0, 0, 0, 0, 0];
    let r = other.execute(Command::new(2, &reserve)).await.unwrap();
    assert_eq!(r.status, 0x00);
    let r = xcopy(&a, 0, &parameters(5, [a0, a2], 8, 0)).await;
    assert_eq!(r.status, 0x18, "RESERVATION CONFLICT writing");
    let r = xcopy(&a, 0, &parameters(6, [a2, a1], 0, 3000)).await;
    assert_eq!(r.status, 0x18, "RESERVATION CONFLICT reading");
    assert!(
        read(&other, 2, 0).await == zeros,
        "nothing written under the reservation"
    );
    // The holder itself may.
    let r = xcopy(&other, 0, &parameters(7, [a0, a2], 8, 0)).await;
    assert_eq!(r.status, 0x00, "{:?}", r.sense());
    assert!(read(&other, 2, 0).await == data);

    // LUN 1 removed by a (forced) reload: its designator reaches nothing.
    let without_1 = file(port, "0 = \"ram:8M\"\n2 = \"ram:8M\"");
    let parsed = ParsedConfig::parse(&without_1).expect("a valid file");
    handle.apply(parsed, true).await.expect("forced reload");
    let r = xcopy(&a, 0, &parameters(8, [a0, a1], 8, 2000)).await;
    assert!(unreachable(&r), "{:?}", r.sense());
    let status = copy_status(&a, 0, 8).await;
    assert_eq!(status.status, 0x02, "nothing held for a refused list");
}
