//! A run's parameters, all drawn from its seed: the negotiated limits,
//! the window, the workload and how rude the network and the initiator
//! are. Drawing them from the seed spreads a budget of runs over the
//! space of negotiations, where a bug hides in one corner.

use iscsi_proto::transfer::Limits;
use rand::Rng;
use rand::rngs::StdRng;

/// One run's parameters.
#[derive(Clone, Debug)]
pub struct Params {
    /// The limits both sides negotiated (equal segment sizes both ways).
    pub limits: Limits,
    /// The target's command window (MaxCmdSN - ExpCmdSN + 1 when idle).
    pub window: u32,
    /// Connections of the session (MC/S: commands spread over them, each
    /// task's PDUs on its own).
    pub connections: usize,
    /// Commands the initiator keeps in flight.
    pub queue_depth: usize,
    /// Commands in the run.
    pub commands: usize,
    /// Blocks of the LUN.
    pub blocks: usize,
    /// The most blocks one command moves.
    pub max_blocks: usize,
    /// The store's latency, in microseconds: low..high.
    pub store_latency: (u64, u64),
    /// Chance a Data-Out's (or immediate data's) digest is damaged.
    pub p_damage_data_out: f64,
    /// Chance a Data-In's digest is damaged (ERL 1 only: at ERL 0 the
    /// initiator's answer is a new session, not simulated here).
    pub p_damage_data_in: f64,
    /// Chance, per tick, that a task in flight is aborted.
    pub p_abort: f64,
    /// Chance, per tick, of an ABORT TASK SET.
    pub p_abort_set: f64,
    /// Chance, per tick, that every connection of the session is lost
    /// (the initiator logs in again, a new session of the same nexus, and
    /// sends again the writes never answered).
    pub p_session_loss: f64,
    /// Chance a command is preceded by one reusing a live tag.
    pub p_duplicate: f64,
    /// Chance a READ is preceded by a malformed one (immediate data with
    /// a command that moves none out, RFC 7143 11.3.4).
    pub p_malformed: f64,
}

impl Params {
    /// Parameters drawn from `rng`.
    pub fn draw(rng: &mut StdRng) -> Self {
        let erl = rng.random_range(0..2u8);
        let segment = [512, 1024, 2048, 4096][rng.random_range(0..4)];
        let max_burst = segment * [1, 2, 4, 8][rng.random_range(0..4)];
        let first_burst = segment * rng.random_range(1..=(max_burst / segment));
        let limits = Limits {
            max_send_segment: segment,
            max_recv_segment: segment,
            max_burst_length: max_burst,
            first_burst_length: first_burst,
            immediate_data: rng.random_bool(0.5),
            initial_r2t: rng.random_bool(0.5),
            max_outstanding_r2t: [1, 2, 4][rng.random_range(0..3)],
            // No where the target is configured so (data_pdu_in_order,
            // data_sequence_in_order) and the initiator asks for it.
            data_pdu_in_order: rng.random_bool(0.7),
            data_sequence_in_order: rng.random_bool(0.7),
            error_recovery_level: erl,
        };
        let pick = |rng: &mut StdRng, choices: &[f64]| choices[rng.random_range(0..choices.len())];
        Params {
            limits,
            window: [1, 4, 16, 64][rng.random_range(0..4)],
            connections: [1, 1, 2, 3][rng.random_range(0..4)],
            queue_depth: rng.random_range(1..=32),
            commands: rng.random_range(100..=600),
            blocks: 256,
            max_blocks: [1, 8, 64][rng.random_range(0..3)],
            store_latency: (10, [50, 500, 5_000][rng.random_range(0..3)]),
            p_damage_data_out: pick(rng, &[0.0, 0.002, 0.02]),
            p_damage_data_in: if erl > 0 {
                pick(rng, &[0.0, 0.01, 0.05])
            } else {
                0.0
            },
            p_abort: pick(rng, &[0.0, 0.0005, 0.005]),
            p_duplicate: pick(rng, &[0.0, 0.01]),
            p_malformed: pick(rng, &[0.0, 0.01]),
            p_abort_set: pick(rng, &[0.0, 0.0, 0.0005, 0.002]),
            p_session_loss: pick(rng, &[0.0, 0.0, 0.0002, 0.001]),
        }
    }
}
