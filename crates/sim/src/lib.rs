//! A deterministic simulator of the target core (issue 47, item 4): the
//! sans-I/O pieces of `iscsi-target-core` called as the target's
//! connection calls them (`target`), a rude initiator with a workload
//! (`initiator`), one link and one store, all on one thread, one seeded
//! random source and a simulated clock (`world`). Oracles: every
//! acknowledged write reads back and no block shows a write that was never
//! acknowledged or aborted (`model`); every task answered exactly once,
//! never after its abort; StatSN, R2TSN and the window's edges in order;
//! no status before the last Data-Out of its task; ABORT TASK answered
//! within a bound; the target's tables bounded and empty at the end. A
//! failing seed replays exactly, and prints the end of its event trace.

pub mod describe;
pub mod initiator;
pub mod model;
pub mod params;
pub mod target;
pub mod world;

use initiator::{Initiator, Stats, Violation};
use params::Params;
use target::{Action, Target};
use world::{Direction, Event, Micros, Wire, World};

/// How often the initiator's clock ticks (simulated microseconds).
const TICK: Micros = 50;
/// Simulated time a run may take: far more than any workload here needs
/// (a fraction of a second), so past it the run is hung.
const RUN_BOUND: Micros = 120_000_000;

/// What a run that passed did.
#[derive(Clone, Debug)]
pub struct Summary {
    /// The parameters the seed drew.
    pub params: Params,
    /// What the initiator did.
    pub stats: Stats,
    /// Simulated time the run took.
    pub simulated: Micros,
    /// Events run.
    pub events: u64,
    /// A hash of every line of the event trace: equal for two runs of a
    /// seed, or the simulator is not deterministic.
    pub trace_hash: u64,
}

/// A run that failed: its seed, what failed, and the end of its trace.
#[derive(Debug)]
pub struct Failure {
    /// The seed that failed.
    pub seed: u64,
    /// The parameters it drew.
    pub params: Params,
    /// The oracle that failed, in words.
    pub violation: Violation,
    /// The last events before the failure.
    pub trace: Vec<String>,
    /// Simulated time of the failure.
    pub at: Micros,
}

/// Runs seed `seed` to its end. `verbose` prints every event as it runs.
pub fn run(seed: u64, verbose: bool) -> Result<Summary, Box<Failure>> {
    let mut world = World::new(seed);
    world.verbose = verbose;
    let params = Params::draw(&mut world.rng);
    let store = target::store(params.blocks);
    let mut sessions = Sessions {
        current: new_session(&params, &store),
        ended: Vec::new(),
        store,
        lost_aborted_before_arrival: 0,
    };
    let mut initiator = Initiator::new(params.clone());
    let result = drive(&mut world, &mut sessions, &mut initiator, &params);
    initiator.stats.aborted_before_arrival = sessions.aborted_before_arrival();
    match result {
        Ok(()) => Ok(Summary {
            params,
            stats: initiator.stats,
            simulated: world.now(),
            events: world.events_run,
            trace_hash: world.trace_hash(),
        }),
        Err(violation) => Err(Box::new(Failure {
            seed,
            params,
            violation,
            trace: world.trace().cloned().collect(),
            at: world.now(),
        })),
    }
}

/// The target's sessions of the run's one I_T nexus: the one logged in,
/// and those lost whose commands are still at the store.
struct Sessions {
    current: Target,
    ended: Vec<Target>,
    store: target::Store,
    /// ABORT TASKs that overtook their command, in the sessions lost.
    lost_aborted_before_arrival: u64,
}

impl Sessions {
    fn aborted_before_arrival(&self) -> u64 {
        self.lost_aborted_before_arrival + self.current.aborted_before_arrival
    }

    /// Every connection is lost: the session ends, a new one waits for
    /// the initiator's login.
    fn lose(&mut self, params: &Params) {
        let mut lost = std::mem::replace(&mut self.current, new_session(params, &self.store));
        lost.lose();
        self.lost_aborted_before_arrival += lost.aborted_before_arrival;
        self.ended.push(lost);
    }

    /// The store finished `itt`: of the current session, or of a lost one
    /// (whose answer has nowhere to go).
    fn store_done(&mut self, itt: u32) -> Vec<Action> {
        if let Some(lost) = self.ended.iter_mut().find(|t| t.executing(itt)) {
            lost.store_done(itt);
            return Vec::new();
        }
        self.current.store_done(itt)
    }

    /// Whether a login of the nexus may be answered: the sessions before
    /// it are over (`quiesce_nexus`); those that are leave.
    fn login_may_proceed(&mut self) -> bool {
        // (A lost session stays while the store holds any of its commands,
        // whatever the core says: their writes land when they land.)
        self.ended.retain(|t| t.at_store() > 0);
        self.ended.iter().all(Target::quiesced)
    }
}

/// A session of `params`' negotiation over `store`.
fn new_session(params: &Params, store: &target::Store) -> Target {
    Target::new(
        params.limits,
        params.window,
        std::rc::Rc::clone(store),
        params.connections,
    )
}

fn drive(
    world: &mut World,
    sessions: &mut Sessions,
    initiator: &mut Initiator,
    params: &Params,
) -> Result<(), Violation> {
    world.at(0, Event::Tick);
    while let Some(event) = world.pop() {
        let target = &mut sessions.current;
        let actions = match event {
            Event::ToTarget(wire) => {
                if matches!(wire.pdu, iscsi_proto::pdu::Pdu::DataOut(_)) {
                    initiator.data_out_arrived(data_out_itt(&wire));
                }
                target.receive(wire.conn, wire.pdu, wire.data, wire.digest_error)
            }
            Event::ToInitiator(wire) => {
                initiator.receive(world, wire)?;
                Vec::new()
            }
            Event::StoreDone(itt) => sessions.store_done(itt),
            Event::Tick => {
                initiator.tick(world)?;
                if initiator.take_session_loss() {
                    world.cut_links();
                    initiator.session_lost(world);
                    sessions.lose(params);
                }
                if !initiator.finished() {
                    world.at(TICK, Event::Tick);
                }
                Vec::new()
            }
        };
        if initiator.logging_in && sessions.login_may_proceed() {
            initiator.logged_in(world);
        }
        let target = &mut sessions.current;
        apply(world, params, actions);
        if world.now() > RUN_BOUND {
            return Err(format!(
                "the run did not end in {} simulated s; tasks {:?} in flight",
                RUN_BOUND / 1_000_000,
                initiator.in_flight()
            ));
        }
        // A write aborted while collecting data leaves its connection's
        // table at that connection's next PDU (as on the target:
        // `sweep_aborted_writes`); until then it holds its buffer, so
        // there may be as many as an ABORT TASK SET ended.
        let held = target.held();
        let bound = params.window as usize + params.queue_depth + 1;
        if held.collecting > held.tasks || held.tasks > bound || held.aborted_collecting > bound {
            return Err(format!(
                "target holds {held:?} (window {}, queue depth {})",
                params.window, params.queue_depth
            ));
        }
    }
    if !initiator.finished() {
        return Err(format!(
            "the run stopped with tasks {:?} in flight",
            initiator.in_flight()
        ));
    }
    if !sessions.login_may_proceed() || !sessions.ended.is_empty() {
        return Err("a lost session still has tasks after the run".to_string());
    }
    let target = &mut sessions.current;
    target.sweep_all();
    let held = target.held();
    if held.tasks != 0 || held.collecting + held.aborted_collecting != 0 {
        return Err(format!("after the run the target still holds {held:?}"));
    }
    // Every block as the store holds it, against the model.
    let store = sessions.store.borrow().clone();
    initiator
        .model
        .read(0, &store)
        .map_err(|e| format!("the LUN after the run: {e}"))
}

fn data_out_itt(wire: &Wire) -> u32 {
    match &wire.pdu {
        iscsi_proto::pdu::Pdu::DataOut(d) => d.initiator_task_tag,
        _ => 0,
    }
}

/// Carries out what the target asked: PDUs onto the link (Data-In digests
/// damaged at the run's rate), commands to the store.
fn apply(world: &mut World, params: &Params, actions: Vec<Action>) {
    for action in actions {
        match action {
            Action::Send(conn, pdu, data) => {
                let damage = matches!(pdu, iscsi_proto::pdu::Pdu::DataIn(_))
                    && world.chance(params.p_damage_data_in);
                world.send(
                    Direction::ToInitiator,
                    Wire {
                        conn,
                        pdu,
                        data,
                        digest_error: damage,
                        sent: 0,
                    },
                );
            }
            Action::Execute(itt) => {
                let (low, high) = params.store_latency;
                let latency = world.rng_range(low as usize, high as usize) as Micros;
                world.at(latency, Event::StoreDone(itt));
            }
        }
    }
}
