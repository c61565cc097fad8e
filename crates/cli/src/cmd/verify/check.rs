//! `iscsi verify --check JOURNAL`: reads every slot a journal names and
//! says whether the LUN holds what the journal requires after a crash.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context, bail};
use iscsi_initiator::{IscsiUrl, Session};

use super::journal::{Expected, Layout, replay};
use super::{Args, block_generation, each_slot};
use crate::cmd::bench::{geometry, runtime};
use crate::cmd::initiator_args::connect;

/// What a check found, counted in blocks where a block is the unit.
#[derive(Debug, Default, serde::Serialize)]
struct CheckReport {
    slots: u64,
    /// Slots with a durable write: those the check can hold to something.
    durable_slots: u64,
    /// Slots whose every block holds their newest acknowledged write
    /// (durable or not; a target killed keeps its page cache).
    acknowledged_slots: u64,
    /// Slots holding blocks of more than one write (a write in flight).
    torn_slots: u64,
    /// Blocks holding an older write than a durable one, or no write of
    /// their slot where a durable one must be.
    lost_blocks: u64,
    /// Blocks holding a generation never written to their slot.
    wrong_blocks: u64,
    failed_reads: u64,
    first_error: Option<String>,
}

/// One block's verdict.
#[derive(Debug, PartialEq, Eq)]
enum Block {
    /// What the journal allows (`Some`: that write's).
    Fine(Option<u32>),
    Lost,
    Wrong,
}

fn judge(expected: &Expected, generation: Option<u32>) -> Block {
    match (generation, expected.durable) {
        (Some(g), _) if expected.possible.contains(&g) => Block::Fine(Some(g)),
        // Nothing durable: whatever was there before may still be.
        (_, None) => Block::Fine(generation),
        (Some(g), Some(durable)) if g < durable => Block::Lost,
        (None, Some(_)) => Block::Lost,
        (Some(_), Some(_)) => Block::Wrong,
    }
}

/// Reads `slot` and counts its blocks' verdicts into `report`.
async fn check_slot(
    session: &Session,
    lun: u64,
    (bs, block): (usize, usize),
    slot: u64,
    expected: &Expected,
    report: &Mutex<CheckReport>,
) {
    let lba = slot * (bs / block) as u64;
    let result = session.read(lun, lba, block as u32, vec![0; bs]).await;
    let mut report = report.lock().unwrap_or_else(PoisonError::into_inner);
    let data = match result {
        Ok(data) => data,
        Err(error) => {
            report.failed_reads += 1;
            report
                .first_error
                .get_or_insert(format!("read of slot {slot}: {error}"));
            return;
        }
    };
    let mut seen = Vec::new();
    let (mut lost, mut wrong) = (0, 0);
    for (index, chunk) in data.chunks(block).enumerate() {
        match judge(expected, block_generation(chunk, slot, index)) {
            Block::Fine(generation) => {
                if !seen.contains(&generation) {
                    seen.push(generation);
                }
            }
            Block::Lost => lost += 1,
            Block::Wrong => wrong += 1,
        }
    }
    if lost + wrong > 0 {
        eprintln!(
            "verify --check: slot {slot}: {lost} blocks lost a durable write, {wrong} hold data no write of the slot made (durable generation {:?}, possible {:?})",
            expected.durable, expected.possible
        );
    }
    report.lost_blocks += lost;
    report.wrong_blocks += wrong;
    report.durable_slots += u64::from(expected.durable.is_some());
    report.torn_slots += u64::from(seen.len() > 1);
    report.acknowledged_slots +=
        u64::from(expected.acknowledged.is_some() && seen == [expected.acknowledged]);
}

/// A session to the LUN at `url`, checked against the journal's `layout`:
/// its block size, and room for every slot.
pub(super) async fn connect_for(
    url: &IscsiUrl,
    layout: Layout,
    args: &Args,
) -> anyhow::Result<Session> {
    let session = connect(url, &args.session).await?;
    let geometry = geometry(&session, url.lun).await?;
    if geometry.block_size != layout.block {
        bail!(
            "the journal was written with {}-byte blocks, the LUN has {}",
            layout.block,
            geometry.block_size
        );
    }
    if layout.slots * layout.bs > geometry.blocks * geometry.block_size {
        bail!("the journal's slots reach past the LUN's end");
    }
    Ok(session)
}

/// Checks the LUN at `url` against the journal at `path`.
pub fn run(url: &IscsiUrl, path: &Path, args: &Args) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the journal {}", path.display()))?;
    let (layout, expected) = replay(&text)?;
    let report = runtime(args.threads)?.block_on(async {
        let session = connect_for(url, layout, args).await?;
        let shared = Arc::new((session, expected, Mutex::new(CheckReport::default())));
        let sizes = (layout.bs as usize, layout.block as usize);
        let lun = url.lun;
        let visiting = shared.clone();
        each_slot(layout.slots, args.qd, move |slot| {
            let shared = visiting.clone();
            async move {
                let (session, expected, report) = &*shared;
                if let Some(slot_expected) = expected.get(slot as usize) {
                    check_slot(session, lun, sizes, slot, slot_expected, report).await;
                }
            }
        })
        .await;
        let (session, _, report) = &*shared;
        let mut report =
            std::mem::take(&mut *report.lock().unwrap_or_else(PoisonError::into_inner));
        report.slots = layout.slots;
        let _ = session.logout().await;
        Ok::<_, anyhow::Error>(report)
    })?;
    if args.json {
        println!("{}", serde_json::to_string(&report).context("the report")?);
    } else {
        println!(
            "verify --check: {} slots, {} with a durable write, {} holding their last acknowledged write, {} torn; {} blocks lost a durable write, {} wrong, {} reads failed{}",
            report.slots,
            report.durable_slots,
            report.acknowledged_slots,
            report.torn_slots,
            report.lost_blocks,
            report.wrong_blocks,
            report.failed_reads,
            report
                .first_error
                .as_deref()
                .map(|e| format!(" (first: {e})"))
                .unwrap_or_default(),
        );
    }
    if report.lost_blocks + report.wrong_blocks + report.failed_reads > 0 {
        bail!(
            "{} blocks lost a durable write, {} are wrong, {} reads failed",
            report.lost_blocks,
            report.wrong_blocks,
            report.failed_reads
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_judged_by_the_newest_durable_write_of_its_slot() {
        let durable = Expected {
            durable: Some(5),
            possible: vec![5, 9],
            acknowledged: Some(5),
        };
        assert_eq!(judge(&durable, Some(5)), Block::Fine(Some(5)));
        assert_eq!(judge(&durable, Some(9)), Block::Fine(Some(9)), "in flight");
        assert_eq!(judge(&durable, Some(3)), Block::Lost, "older than durable");
        assert_eq!(judge(&durable, None), Block::Lost, "no write at all");
        assert_eq!(judge(&durable, Some(7)), Block::Wrong, "never issued here");
        let loose = Expected {
            durable: None,
            possible: vec![4],
            acknowledged: Some(4),
        };
        assert_eq!(judge(&loose, None), Block::Fine(None));
        assert_eq!(judge(&loose, Some(2)), Block::Fine(Some(2)));
    }
}
