//! The gateways of one medium outside a gateway group, in memory
//! (`test_cluster`): a read, compare and write under the LU's lock runs
//! only while one gateway serves the LU, and a gateway that joins waits
//! for the ones up to finish theirs before it serves.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::test_cluster::{Cluster, GatewayStore};
use crate::test_store::TestStore;

/// A gateway of `medium` joined to `cluster`'s record: its LU and its
/// client id.
fn gateway(cluster: &Arc<Cluster>, medium: &Arc<TestStore>) -> (Arc<LogicalUnit>, u64) {
    let store = GatewayStore::new(cluster, medium);
    let gid = store.gid();
    (logical_unit(Arc::new(store), &KnownNexuses::default()), gid)
}

const REFUSAL: Sense = Sense::INVALID_FIELD_IN_CDB;

fn medium() -> Arc<TestStore> {
    Arc::new(TestStore::new(1 << 20, 4096, 9))
}

fn caw(lu: &LogicalUnit) -> Result<(), Fail> {
    exclusive_alone(lu, lu.io_epoch(), "COMPARE AND WRITE", REFUSAL).map(drop)
}

fn listed(lu: &LogicalUnit) -> Vec<u64> {
    lu.state().cluster.gateways.iter().map(|g| g.gid).collect()
}

#[test]
fn a_lone_gateway_compares_under_its_own_lock() {
    let (cluster, medium) = (Arc::new(Cluster::default()), medium());
    let (lu, _) = gateway(&cluster, &medium);
    assert_eq!(caw(&lu), Ok(()));
}

/// The second gateway's join reaches the first before the second serves:
/// both refuse, with ILLEGAL REQUEST, INVALID FIELD IN CDB.
#[test]
fn with_a_second_gateway_up_both_refuse() {
    let (cluster, medium) = (Arc::new(Cluster::default()), medium());
    let (one, g1) = gateway(&cluster, &medium);
    let (two, g2) = gateway(&cluster, &medium);
    assert_eq!(listed(&one), [g1, g2]);
    for lu in [&one, &two] {
        assert_eq!(caw(lu), Err(Fail::Check(REFUSAL)));
    }
    assert!(cluster.fenced().is_empty());
}

/// A gateway that died stays listed; asked, it answers nothing, so the
/// survivor fences and forgets it, then serves the LU alone.
#[test]
fn a_gateway_that_answers_nothing_is_fenced_and_the_survivor_goes_on() {
    let (cluster, medium) = (Arc::new(Cluster::default()), medium());
    let (one, g1) = gateway(&cluster, &medium);
    let (_two, g2) = gateway(&cluster, &medium);
    cluster.lose(g2);
    assert_eq!(caw(&one), Ok(()));
    assert_eq!(cluster.fenced(), [format!("127.0.0.1:0/{g2}")]);
    assert_eq!(listed(&one), [g1]);
}

/// A gateway joining while a compare and write holds the first one's
/// lock does not finish joining (and so does not serve) until it is let
/// go, and the first is not fenced for the wait.
#[test]
fn a_joining_gateway_waits_for_the_compare_in_flight() {
    let (cluster, medium) = (Arc::new(Cluster::default()), medium());
    let (one, _) = gateway(&cluster, &medium);
    let in_flight = exclusive_alone(&one, one.io_epoch(), "COMPARE AND WRITE", REFUSAL).unwrap();
    let joining = {
        let (cluster, medium) = (Arc::clone(&cluster), Arc::clone(&medium));
        std::thread::spawn(move || gateway(&cluster, &medium))
    };
    std::thread::sleep(Duration::from_millis(300));
    assert!(!joining.is_finished(), "joined with a compare in flight");
    drop(in_flight);
    let (two, _) = joining.join().unwrap();
    assert!(cluster.fenced().is_empty());
    assert_eq!(caw(&one), Err(Fail::Check(REFUSAL)));
    assert_eq!(caw(&two), Err(Fail::Check(REFUSAL)));
}
