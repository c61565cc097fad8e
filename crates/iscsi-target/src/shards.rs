//! One runtime per core: the shards connections live on.
//!
//! Why: on tokio's work-stealing runtime a connection's reader, its
//! writer and the tasks it spawns move between worker threads, each move a
//! cross-core wake-up and cache lines written from two cores; and all
//! workers share one timer wheel. Measured on 8 cores, the target's CPU per
//! I/O doubled against 1 core. Here each shard is a thread running a
//! current-thread runtime (its own I/O driver, timer wheel and blocking
//! pool), pinned to one of the CPUs the process may use; a connection is
//! placed on the shard with the fewest connections when it is accepted and
//! stays there for its life, with everything it spawns.
//!
//! What crosses connections still works across shards, because it never
//! assumed one thread: a session's state is shared (`Arc`, locks and
//! atomics), a connection's writer is a tokio mutex around a socket that
//! any thread may write (the socket's readiness comes from its own shard's
//! driver), and waking a task on another shard is tokio's remote schedule.
//! So MC/S connections of one session may sit on different shards, a task
//! may be reassigned (ERL 2) to a connection on another shard, and task
//! management aborts tasks wherever they run.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tracing::{debug, warn};

thread_local! {
    /// The index of the shard this thread runs, if it is one.
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The shard the calling thread runs (`None` off the shards: the accept
/// loops, the control socket, tests' runtimes).
pub(crate) fn current() -> Option<usize> {
    CURRENT.with(Cell::get)
}

/// The CPUs the calling thread may run on, in order (its affinity mask),
/// or `None` where the mask cannot be read. Also what `iscsi bench`'s
/// shards are pinned by.
pub fn allowed_cpus() -> Option<Vec<usize>> {
    let set = rustix::thread::sched_getaffinity(None).ok()?;
    let cpus: Vec<usize> = (0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&i| set.is_set(i))
        .collect();
    (!cpus.is_empty()).then_some(cpus)
}

/// Pins the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set)?;
    Ok(())
}

/// How many shards to run by default: one per CPU the process may use.
pub fn default_count() -> usize {
    allowed_cpus().map_or_else(
        || std::thread::available_parallelism().map_or(1, usize::from),
        |cpus| cpus.len(),
    )
}

struct Shard {
    handle: Handle,
    /// Connections living on it now: where the next one goes.
    connections: Arc<AtomicUsize>,
    /// The CPU it is pinned to.
    cpu: Option<usize>,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// The running shards of one target.
pub(crate) struct Shards {
    shards: Vec<Shard>,
    /// Where the search for the least loaded shard starts: turns, so
    /// equally loaded shards are used in turn.
    next: AtomicUsize,
}

/// Takes a connection off its shard's count when its task ends, however it
/// ends (finished, cancelled at shutdown, panicked).
struct Placed(Arc<AtomicUsize>);

impl Drop for Placed {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Shards {
    /// Starts `count` shards (at least one). With no more shards than
    /// CPUs allowed, shard `i` is pinned to the `i`-th of them; with more,
    /// the kernel places them.
    pub fn start(count: usize) -> std::io::Result<Self> {
        let count = count.max(1);
        let cpus = allowed_cpus().filter(|cpus| cpus.len() >= count);
        let mut shards = Vec::with_capacity(count);
        for index in 0..count {
            let cpu = cpus.as_ref().and_then(|cpus| cpus.get(index).copied());
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let handle = runtime.handle().clone();
            let (stop, stopped) = oneshot::channel::<()>();
            let thread = std::thread::Builder::new()
                .name(format!("iscsi-shard-{index}"))
                .spawn(move || {
                    CURRENT.with(|c| c.set(Some(index)));
                    if let Some(cpu) = cpu
                        && let Err(error) = pin_current_thread(cpu)
                    {
                        warn!(index, cpu, %error, "shard not pinned to its CPU");
                    }
                    let _ = runtime.block_on(stopped);
                    // Dropping the runtime cancels what is left on it
                    // (only at the end of the target).
                })?;
            debug!(index, ?cpu, "shard started");
            shards.push(Shard {
                handle,
                connections: Arc::default(),
                cpu,
                stop: Mutex::new(Some(stop)),
                thread: Mutex::new(Some(thread)),
            });
        }
        Ok(Self {
            shards,
            next: AtomicUsize::new(0),
        })
    }

    /// How many shards run.
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    /// The CPU each shard is pinned to (`None`: not pinned).
    pub fn cpus(&self) -> Vec<Option<usize>> {
        self.shards.iter().map(|s| s.cpu).collect()
    }

    /// The connections on each shard now.
    pub fn loads(&self) -> Vec<usize> {
        self.shards
            .iter()
            .map(|s| s.connections.load(Ordering::Relaxed))
            .collect()
    }

    /// The shard a new connection goes to: the least loaded, the search
    /// starting one further each time.
    fn pick(&self) -> &Shard {
        let n = self.shards.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let mut best = start;
        let mut best_load = usize::MAX;
        for k in 0..n {
            let i = (start + k) % n;
            let load = self.shards[i].connections.load(Ordering::Relaxed);
            if load < best_load {
                best = i;
                best_load = load;
            }
        }
        &self.shards[best]
    }

    /// Runs a connection's `task` on the least loaded shard, for its life,
    /// in `set` (so the accept loop still waits for it).
    pub fn spawn<F>(&self, set: &mut JoinSet<()>, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let shard = self.pick();
        shard.connections.fetch_add(1, Ordering::Relaxed);
        let placed = Placed(Arc::clone(&shard.connections));
        set.spawn_on(
            async move {
                let _placed = placed;
                task.await;
            },
            &shard.handle,
        );
    }

    /// Stops every shard and waits for its thread, cancelling what still
    /// runs there. Called when the target has finished serving; from a
    /// shard's own thread it only asks (a thread cannot wait for itself).
    pub fn stop(&self) {
        for shard in &self.shards {
            if let Some(stop) = shard
                .stop
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
            {
                let _ = stop.send(());
            }
        }
        if current().is_some() {
            return;
        }
        for shard in &self.shards {
            let thread = shard
                .thread
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if let Some(thread) = thread {
                let _ = thread.join();
            }
        }
    }
}

impl Drop for Shards {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connections_go_to_the_least_loaded_shard_and_stay_on_it() {
        let shards = Shards::start(3).unwrap();
        assert_eq!(shards.len(), 3);
        let mut set = JoinSet::new();
        let (release, released) = tokio::sync::watch::channel(false);
        let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
        for _ in 0..6 {
            let mut released = released.clone();
            let seen_tx = seen_tx.clone();
            shards.spawn(&mut set, async move {
                let before = current();
                // Whatever the task spawns runs on its shard too.
                let inner = tokio::spawn(async { current() }).await.unwrap();
                seen_tx.send((before, inner)).unwrap();
                let _ = released.wait_for(|&r| r).await;
                assert_eq!(current(), before, "moved to another shard");
            });
        }
        let mut per_shard = [0usize; 3];
        for _ in 0..6 {
            let (shard, inner) = seen.recv().await.unwrap();
            assert_eq!(shard, inner);
            per_shard[shard.unwrap()] += 1;
        }
        assert_eq!(per_shard, [2, 2, 2], "spread evenly");
        assert_eq!(shards.loads(), vec![2, 2, 2]);
        release.send_replace(true);
        while let Some(r) = set.join_next().await {
            r.unwrap();
        }
        assert_eq!(shards.loads(), vec![0, 0, 0], "counts follow the ends");
        assert_eq!(current(), None, "the test's own runtime is no shard");
        shards.stop();
    }
}
