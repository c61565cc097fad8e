//! The simulator's own guarantees: a seed replays exactly, and a sweep of
//! seeds over the real core finds nothing (the planted bugs are found by
//! `scripts/sim`, in a build with the `planted` feature).

#[test]
fn a_seed_replays_exactly() {
    for seed in [1, 7, 40, 1234] {
        let first = iscsi_sim::run(seed, false).expect("a clean seed");
        let second = iscsi_sim::run(seed, false).expect("a clean seed");
        assert_eq!(first.trace_hash, second.trace_hash, "seed {seed}");
        assert_eq!(first.events, second.events, "seed {seed}");
        assert_eq!(first.simulated, second.simulated, "seed {seed}");
    }
}

#[test]
fn different_seeds_draw_different_runs() {
    let a = iscsi_sim::run(2, false).expect("a clean seed");
    let b = iscsi_sim::run(3, false).expect("a clean seed");
    assert_ne!(a.trace_hash, b.trace_hash);
}

#[test]
fn two_hundred_seeds_find_nothing_in_the_core() {
    let mut faults = 0;
    for seed in 1000..1200 {
        match iscsi_sim::run(seed, false) {
            Ok(summary) => {
                let s = summary.stats;
                faults += s.damaged + s.aborted + s.snacks + s.duplicates;
            }
            Err(failure) => panic!(
                "seed {seed}: {}\n{}",
                failure.violation,
                failure.trace.join("\n")
            ),
        }
    }
    assert!(faults > 1000, "the sweep made only {faults} faults");
}
