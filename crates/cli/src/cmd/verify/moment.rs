//! `iscsi verify --check JOURNAL --snapshot NAME`: reads a snapshot taken
//! while a journaled load ran (served as a LUN) and says whether it holds
//! one moment of that load.
//!
//! Whoever takes the snapshot appends `S NAME` to the journal before
//! asking and `T NAME` once answered (the journal is opened O_APPEND, so
//! the lines fall in the order things happened). A write's `W` line is
//! written before it is sent and its `A` line after its answer came, so
//! the journal's order is never kinder than the truth. The snapshot must
//! hold, per slot:
//!
//! - every write answered before `S` (or a later one): else *lost*;
//! - no write issued after `T`: else *late*;
//! - only generations written to the slot: else *wrong*;
//! - and, across slots, no write without those it depended on: if a write
//!   in the snapshot was issued after another write was answered, that
//!   other one (or a later write of its slot) is in it too: else *out of
//!   order*. This is what makes a snapshot crash consistent rather than a
//!   mix of moments, and what a journaling file system needs of it.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context, bail};
use iscsi_initiator::IscsiUrl;

use super::journal::{Entry, Layout, entries};
use super::{Args, block_generation, each_slot};
use crate::cmd::bench::runtime;

/// One write of a slot, by journal line.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Write {
    generation: u32,
    issued: usize,
    answered: Option<usize>,
}

/// What the journal says of the moment of snapshot NAME.
#[derive(Debug)]
struct Moment {
    /// The line of `S NAME` and of `T NAME`.
    asked: usize,
    taken: usize,
    /// Per slot, its writes in order.
    writes: Vec<Vec<Write>>,
}

impl Moment {
    /// The newest write of `slot` answered before line `line`.
    fn answered_before(&self, slot: usize, line: usize) -> Option<u32> {
        self.writes[slot]
            .iter()
            .filter(|w| w.answered.is_some_and(|a| a < line))
            .map(|w| w.generation)
            .max()
    }

    fn write(&self, slot: usize, generation: u32) -> Option<&Write> {
        self.writes[slot]
            .iter()
            .find(|w| w.generation == generation)
    }
}

/// Reads a journal back for snapshot `name`.
fn replay(text: &str, name: &str) -> anyhow::Result<(Layout, Moment)> {
    let (layout, entries) = entries(text)?;
    let mut writes: Vec<Vec<Write>> = vec![Vec::new(); layout.slots as usize];
    let (mut asked, mut taken) = (None, None);
    for (number, entry) in entries {
        match entry {
            Entry::Snapshot {
                taken: done,
                name: n,
            } if n == name => match done {
                false => asked = asked.or(Some(number)),
                true => taken = taken.or(Some(number)),
            },
            Entry::Write {
                kind,
                slot,
                generation,
            } => {
                let slot = &mut writes[slot as usize];
                if kind == 'W' {
                    slot.push(Write {
                        generation,
                        issued: number,
                        answered: None,
                    });
                } else {
                    let Some(write) = slot.iter_mut().find(|w| w.generation == generation) else {
                        bail!("journal line {number}: acknowledged but never issued");
                    };
                    write.answered.get_or_insert(number);
                }
            }
            Entry::Snapshot { .. } | Entry::Flush { .. } => {}
        }
    }
    match (asked, taken) {
        (Some(asked), Some(taken)) if asked < taken => Ok((
            layout,
            Moment {
                asked,
                taken,
                writes,
            },
        )),
        _ => bail!(
            "the journal does not say when snapshot {name:?} was taken: it needs a line \
             `S {name}` before the request and `T {name}` after its answer"
        ),
    }
}

/// Per slot, the generation of each of its blocks (`None`: not a
/// pattern of the slot); `None` for a slot whose read failed.
type Held = Vec<Option<Vec<Option<u32>>>>;

/// What the check found, in blocks where a block is the unit.
#[derive(Debug, Default, PartialEq, Eq, serde::Serialize)]
struct MomentReport {
    slots: u64,
    /// Slots holding a write issued between `S` and `T`: the writes the
    /// snapshot could take or leave.
    slots_in_between: u64,
    /// Slots holding blocks of more than one write.
    torn_slots: u64,
    lost_blocks: u64,
    late_blocks: u64,
    wrong_blocks: u64,
    out_of_order_blocks: u64,
    failed_reads: u64,
    first_error: Option<String>,
}

impl MomentReport {
    fn failures(&self) -> u64 {
        self.lost_blocks
            + self.late_blocks
            + self.wrong_blocks
            + self.out_of_order_blocks
            + self.failed_reads
    }
}

/// Judges what each slot's blocks hold (`None` for a slot that could not
/// be read) against `moment`.
fn judge(moment: &Moment, held: &[Option<Vec<Option<u32>>>]) -> MomentReport {
    let mut report = MomentReport {
        slots: held.len() as u64,
        ..MomentReport::default()
    };
    // The latest issue of any write the snapshot holds: every write
    // answered before it must be there too.
    let newest_issue = held
        .iter()
        .enumerate()
        .filter_map(|(slot, blocks)| Some((slot, blocks.as_ref()?)))
        .flat_map(|(slot, blocks)| {
            blocks
                .iter()
                .filter_map(move |g| moment.write(slot, (*g)?).map(|w| w.issued))
        })
        .max();
    for (slot, blocks) in held.iter().enumerate() {
        let Some(blocks) = blocks else {
            report.failed_reads += 1;
            continue;
        };
        let floor = moment.answered_before(slot, moment.asked);
        let needed = newest_issue
            .and_then(|line| moment.answered_before(slot, line))
            .max(floor);
        let mut seen: Vec<Option<u32>> = Vec::new();
        let mut between = false;
        for &generation in blocks {
            if !seen.contains(&generation) {
                seen.push(generation);
            }
            let write = generation.and_then(|g| moment.write(slot, g));
            let problem = match (generation, write) {
                (Some(_), None) => Some(&mut report.wrong_blocks),
                (_, Some(w)) if w.issued > moment.taken => Some(&mut report.late_blocks),
                _ if generation < floor => Some(&mut report.lost_blocks),
                _ if generation < needed => Some(&mut report.out_of_order_blocks),
                _ => None,
            };
            if let Some(count) = problem {
                *count += 1;
                report.first_error.get_or_insert_with(|| {
                    format!(
                        "slot {slot} holds generation {generation:?}: answered before the \
                         snapshot {floor:?}, needed by its other writes {needed:?}"
                    )
                });
            }
            between |= write.is_some_and(|w| w.issued > moment.asked && w.issued < moment.taken);
        }
        report.torn_slots += u64::from(seen.len() > 1);
        report.slots_in_between += u64::from(between);
    }
    report
}

/// Checks the snapshot served at `url` against the journal at `path`.
pub fn run(url: &IscsiUrl, path: &Path, name: &str, args: &Args) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the journal {}", path.display()))?;
    let (layout, moment) = replay(&text, name)?;
    let held = runtime(args.threads)?.block_on(async {
        let session = super::check::connect_for(url, layout, args).await?;
        let held: Arc<Mutex<Held>> = Arc::new(Mutex::new(vec![None; layout.slots as usize]));
        let session = Arc::new(session);
        let (bs, block, lun) = (layout.bs as usize, layout.block as usize, url.lun);
        let (reader, into) = (session.clone(), held.clone());
        each_slot(layout.slots, args.qd, move |slot| {
            let (session, into) = (reader.clone(), into.clone());
            async move {
                let lba = slot * (bs / block) as u64;
                let Ok(data) = session.read(lun, lba, block as u32, vec![0; bs]).await else {
                    return;
                };
                let generations = (data.chunks(block).enumerate())
                    .map(|(index, chunk)| block_generation(chunk, slot, index))
                    .collect();
                into.lock().unwrap_or_else(PoisonError::into_inner)[slot as usize] =
                    Some(generations);
            }
        })
        .await;
        let _ = session.logout().await;
        let held = std::mem::take(&mut *held.lock().unwrap_or_else(PoisonError::into_inner));
        Ok::<_, anyhow::Error>(held)
    })?;
    let report = judge(&moment, &held);
    if args.json {
        println!("{}", serde_json::to_string(&report).context("the report")?);
    } else {
        println!(
            "verify --check --snapshot {name}: {} slots, {} holding a write from while it was \
             taken, {} torn; {} blocks lost an answered write, {} hold a write issued after, {} \
             wrong, {} out of order, {} reads failed{}",
            report.slots,
            report.slots_in_between,
            report.torn_slots,
            report.lost_blocks,
            report.late_blocks,
            report.wrong_blocks,
            report.out_of_order_blocks,
            report.failed_reads,
            report
                .first_error
                .as_deref()
                .map(|e| format!(" (first: {e})"))
                .unwrap_or_default(),
        );
    }
    if report.failures() > 0 {
        bail!("snapshot {name} is not one moment of the load");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "iscsi-verify-journal 1 bs=4096 block=512 slots=3\n";

    fn moment(body: &str) -> Moment {
        replay(&format!("{HEAD}{body}"), "s").expect("replays").1
    }

    fn verdict(body: &str, held: [u32; 3]) -> MomentReport {
        let held: Vec<_> = held
            .iter()
            .map(|&g| Some(vec![(g > 0).then_some(g); 2]))
            .collect();
        judge(&moment(body), &held)
    }

    /// Slot 0: write 1 answered before the snapshot was asked; slot 1:
    /// write 2 issued after 1 was answered, in flight across it; slot 2:
    /// write 3 issued after write 2 was answered (while the snapshot was
    /// being taken); slot 0: write 4 issued after it was taken.
    const LOAD: &str = "W 0 1\nA 0 1\nW 1 2\nS s\nA 1 2\nW 2 3\nT s\nA 2 3\nW 0 4\nA 0 4\n";

    #[test]
    fn one_moment_passes_and_every_other_is_named() {
        // Before the writes in flight, after one, after both.
        for held in [[1, 0, 0], [1, 2, 0], [1, 2, 3]] {
            let report = verdict(LOAD, held);
            assert_eq!(report.failures(), 0, "{held:?}: {report:?}");
        }
        assert_eq!(verdict(LOAD, [1, 2, 3]).slots_in_between, 1);
        assert_eq!(verdict(LOAD, [0, 0, 0]).lost_blocks, 2, "write 1 missing");
        assert_eq!(
            verdict(LOAD, [4, 2, 3]).late_blocks,
            2,
            "write 4 came after"
        );
        assert_eq!(verdict(LOAD, [1, 7, 0]).wrong_blocks, 2, "never written");
        // Write 3 without write 2, which was answered before 3 was issued.
        assert_eq!(verdict(LOAD, [1, 0, 3]).out_of_order_blocks, 2);
    }

    #[test]
    fn torn_slots_and_failed_reads_are_counted() {
        let m = moment(LOAD);
        let report = judge(
            &m,
            &[Some(vec![Some(1), Some(1)]), None, Some(vec![None, None])],
        );
        assert_eq!((report.failed_reads, report.failures()), (1, 1));
        let report = judge(
            &m,
            &[
                Some(vec![Some(1), Some(1)]),
                Some(vec![Some(2), None]),
                Some(vec![None, None]),
            ],
        );
        assert_eq!((report.torn_slots, report.failures()), (1, 0), "{report:?}");
    }

    proptest::proptest! {
        /// A journal is a file a user names: any text gets a verdict or an
        /// error, never a panic.
        #[test]
        fn any_journal_is_judged_or_refused(
            entries in proptest::collection::vec((0u8..7, 0u64..5, 0u32..20), 0..60),
            held in proptest::collection::vec(proptest::option::of(0u32..20), 3),
            noise in ".{0,40}",
        ) {
            let mut text = HEAD.to_owned();
            for (kind, slot, n) in entries {
                match ["W", "A", "U", "F", "S", "T", "X"][kind as usize] {
                    "F" => text += &format!("F {n}\n"),
                    k @ ("S" | "T") => text += &format!("{k} s\n"),
                    k => text += &format!("{k} {slot} {n}\n"),
                }
            }
            if let Ok((_, m)) = replay(&text, "s") {
                let held: Vec<_> = held.iter().map(|g| Some(vec![*g; 2])).collect();
                let report = judge(&m, &held);
                proptest::prop_assert_eq!(report.slots, 3);
            }
            let _ = replay(&format!("{text}{noise}"), "s");
            let _ = replay(&noise, "s");
        }
    }

    #[test]
    fn a_journal_without_the_snapshot_is_refused() {
        for body in ["W 0 1\n", "S s\n", "T s\nS s\n", "S t\nT t\n"] {
            let error = replay(&format!("{HEAD}{body}"), "s").unwrap_err();
            assert!(error.to_string().contains("`S s`"), "{body:?}: {error}");
        }
        assert!(replay(&format!("{HEAD}S s\nT s\nX 1 2\n"), "s").is_err());
        assert!(replay(&format!("{HEAD}S s\nT s\nA 0 1\n"), "s").is_err());
    }
}
