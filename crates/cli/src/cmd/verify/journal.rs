//! The journal of `iscsi verify --journal`: every write as it is issued,
//! acknowledged and made durable, one line each, so that another run
//! (`--check`) can say what a LUN must hold after the target or the
//! initiator was killed.
//!
//! ```text
//! iscsi-verify-journal 1 bs=65536 block=512 slots=1024
//! W 17 42      write of generation 42 to slot 17 issued
//! A 17 42      acknowledged (GOOD)
//! U 17 42      acknowledged, and durable at once (FUA, or WCE off)
//! F 3          SYNCHRONIZE CACHE number 3 sent
//! D 3          ... and GOOD: every write acknowledged before F 3 is durable
//! S nightly    snapshot `nightly` of the LUN asked for (appended by whoever
//! T nightly    takes it: the file is opened O_APPEND), and answered
//! ```
//!
//! Each line goes out in one `write(2)` on an append-only file, so a
//! killed process leaves whole lines behind (a last line without its
//! newline is ignored). SBC-4 says what a crash may leave: a write that
//! was durable (FUA, SBC-4 5.40; or acknowledged before a SYNCHRONIZE
//! CACHE that completed, 5.30) must be there, or a later write of the
//! same slot; a write acknowledged without either may be lost, and one in
//! flight may be there in part.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use anyhow::{Context, bail};

/// The first line's words before the numbers.
const MAGIC: &str = "iscsi-verify-journal 1";

/// What the journal's first line records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Bytes per slot.
    pub bs: u64,
    /// The LUN's block size: each block of a slot carries its own header.
    pub block: u64,
    pub slots: u64,
}

/// A journal being written.
pub struct Journal {
    file: Mutex<File>,
}

impl Journal {
    /// Creates (or empties) `path` and writes the layout line.
    pub fn create(path: &Path, layout: Layout) -> anyhow::Result<Journal> {
        OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(path)
            .with_context(|| format!("creating the journal {}", path.display()))?;
        // Appending: another process may add lines too (`S`/`T`, a
        // snapshot taken while this load runs), each landing whole between
        // ours, in the order they happened.
        let file = OpenOptions::new()
            .append(true)
            .open(path)
            .with_context(|| format!("opening the journal {}", path.display()))?;
        let journal = Journal {
            file: Mutex::new(file),
        };
        journal
            .line(&format!(
                "{MAGIC} bs={} block={} slots={}\n",
                layout.bs, layout.block, layout.slots
            ))
            .context("writing the journal")?;
        Ok(journal)
    }

    fn line(&self, line: &str) -> io::Result<()> {
        // One write per line: what a kill leaves is whole lines.
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        file.write_all(line.as_bytes())
    }

    /// A write of `generation` to `slot` is about to be sent.
    pub fn issued(&self, slot: u64, generation: u32) -> io::Result<()> {
        self.line(&format!("W {slot} {generation}\n"))
    }

    /// That write was acknowledged; `durable` if it was a FUA write.
    pub fn acknowledged(&self, slot: u64, generation: u32, durable: bool) -> io::Result<()> {
        let kind = if durable { 'U' } else { 'A' };
        self.line(&format!("{kind} {slot} {generation}\n"))
    }

    /// SYNCHRONIZE CACHE number `flush` is about to be sent.
    pub fn flush_started(&self, flush: u64) -> io::Result<()> {
        self.line(&format!("F {flush}\n"))
    }

    /// It completed with GOOD.
    pub fn flush_done(&self, flush: u64) -> io::Result<()> {
        self.line(&format!("D {flush}\n"))
    }
}

/// What one slot may hold after a crash.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expected {
    /// The newest durable generation: this one or a later write must be
    /// there.
    pub durable: Option<u32>,
    /// The generations the slot's blocks may hold: the durable one and
    /// every write issued after it (all of them when none is durable).
    pub possible: Vec<u32>,
    /// The newest acknowledged generation (durable or not).
    pub acknowledged: Option<u32>,
}

impl Expected {
    fn made_durable(&mut self, generation: u32) {
        if self.durable.is_none_or(|durable| durable < generation) {
            self.durable = Some(generation);
            // Generations grow: what was issued before is overwritten.
            self.possible.retain(|&g| g >= generation);
        }
    }
}

/// One line of a journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// `W`, `A` or `U`: a write of `generation` to `slot` issued,
    /// acknowledged, or acknowledged durable.
    Write {
        kind: char,
        slot: u64,
        generation: u32,
    },
    /// `F` (`done` false) or `D`: SYNCHRONIZE CACHE number `flush` sent or
    /// completed.
    Flush { done: bool, flush: u64 },
    /// `S` (`taken` false) or `T`: snapshot `name` asked for or answered.
    Snapshot { taken: bool, name: String },
}

/// A journal's layout and its entries with their line numbers (from 2),
/// every slot in range; a last line cut short by a kill left out.
pub fn entries(text: &str) -> anyhow::Result<(Layout, Vec<(usize, Entry)>)> {
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().unwrap_or_default();
    let layout = parse_layout(first.trim_end())
        .with_context(|| format!("not an iscsi verify journal: {:?}", first.trim_end()))?;
    let mut entries = Vec::new();
    for (number, line) in (2..).zip(lines) {
        let Some(line) = line.strip_suffix('\n') else {
            break; // cut short by a kill
        };
        let what = || format!("journal line {number}: {line:?}");
        if let Some((kind, name)) = snapshot_line(line) {
            let taken = kind == "T";
            let name = name.to_owned();
            entries.push((number, Entry::Snapshot { taken, name }));
            continue;
        }
        let mut words = line.split(' ');
        let kind = words.next().unwrap_or_default();
        let numbers: Vec<u64> = words
            .map(str::parse)
            .collect::<Result<_, _>>()
            .with_context(what)?;
        let entry = match (kind, numbers.as_slice()) {
            ("W" | "A" | "U", &[slot, generation]) => {
                if slot >= layout.slots {
                    bail!("{}: no such slot", what());
                }
                let generation = u32::try_from(generation).with_context(what)?;
                let kind = kind.chars().next().unwrap_or('W');
                Entry::Write {
                    kind,
                    slot,
                    generation,
                }
            }
            ("F" | "D", &[flush]) => Entry::Flush {
                done: kind == "D",
                flush,
            },
            _ => bail!("{}: not a journal entry", what()),
        };
        entries.push((number, entry));
    }
    Ok((layout, entries))
}

/// Reads a journal back: its layout and what each slot may hold.
pub fn replay(text: &str) -> anyhow::Result<(Layout, Vec<Expected>)> {
    let (layout, entries) = entries(text)?;
    let mut slots = vec![Expected::default(); layout.slots as usize];
    // Acknowledged, not yet durable, in order; a flush covers a prefix.
    let mut acknowledged: Vec<(u64, u32)> = Vec::new();
    let mut durable_upto = 0;
    let mut flushes: Vec<(u64, usize)> = Vec::new();
    for (number, entry) in entries {
        let what = || format!("journal line {number}: {entry:?}");
        match &entry {
            &Entry::Write {
                kind,
                slot,
                generation,
            } => {
                let expected = &mut slots[slot as usize];
                match kind {
                    'W' => expected.possible.push(generation),
                    _ if !expected.possible.contains(&generation) => {
                        bail!("{}: acknowledged but never issued", what())
                    }
                    'A' => {
                        expected.acknowledged = Some(generation);
                        acknowledged.push((slot, generation));
                    }
                    _ => {
                        expected.acknowledged = Some(generation);
                        expected.made_durable(generation);
                    }
                }
            }
            &Entry::Flush { done: false, flush } => flushes.push((flush, acknowledged.len())),
            &Entry::Flush { done: true, flush } => {
                let Some(&(_, covered)) = flushes.iter().find(|(f, _)| *f == flush) else {
                    bail!("{}: a flush never started", what());
                };
                for &(slot, generation) in acknowledged.get(durable_upto..covered).unwrap_or(&[]) {
                    slots[slot as usize].made_durable(generation);
                }
                durable_upto = durable_upto.max(covered);
            }
            // A snapshot says nothing of what a crash keeps.
            Entry::Snapshot { .. } => {}
        }
    }
    Ok((layout, slots))
}

/// An `S NAME` or `T NAME` line: the kind and the name.
pub fn snapshot_line(line: &str) -> Option<(&str, &str)> {
    let (kind, name) = line.split_once(' ')?;
    (matches!(kind, "S" | "T") && !name.is_empty() && !name.contains(' ')).then_some((kind, name))
}

/// Parses the first line of a journal.
pub fn parse_layout(line: &str) -> Option<Layout> {
    let rest = line.strip_prefix(MAGIC)?;
    let mut layout = Layout {
        bs: 0,
        block: 0,
        slots: 0,
    };
    for word in rest.split_whitespace() {
        let (key, value) = word.split_once('=')?;
        let value: u64 = value.parse().ok()?;
        match key {
            "bs" => layout.bs = value,
            "block" => layout.block = value,
            "slots" => layout.slots = value,
            _ => return None,
        }
    }
    let sane = layout.block > 0
        && layout.bs >= layout.block
        && layout.bs.is_multiple_of(layout.block)
        && layout.slots > 0
        && layout.slots <= 1 << 24;
    sane.then_some(layout)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "iscsi-verify-journal 1 bs=4096 block=512 slots=3\n";

    fn slots(body: &str) -> Vec<Expected> {
        replay(&format!("{HEAD}{body}")).expect("replays").1
    }

    #[test]
    fn a_fua_write_is_durable_when_acknowledged_and_a_plain_one_never_alone() {
        let s = slots("W 0 1\nU 0 1\nW 1 2\nA 1 2\nW 0 3\n");
        assert_eq!(s[0].durable, Some(1));
        assert_eq!(
            s[0].possible,
            vec![1, 3],
            "the write in flight may be there"
        );
        assert_eq!(s[1].durable, None);
        assert_eq!(s[1].acknowledged, Some(2));
        assert_eq!(s[2], Expected::default());
    }

    #[test]
    fn a_completed_flush_makes_what_was_acknowledged_before_it_durable() {
        let s = slots("W 0 1\nA 0 1\nF 1\nW 1 2\nA 1 2\nD 1\nW 0 3\nA 0 3\nF 2\n");
        assert_eq!(s[0].durable, Some(1), "flush 2 never completed");
        assert_eq!(s[0].possible, vec![1, 3]);
        assert_eq!(s[1].durable, None, "acknowledged after flush 1 started");
        let s = slots("W 0 1\nA 0 1\nF 1\nW 1 2\nA 1 2\nD 1\nF 2\nD 2\n");
        assert_eq!((s[0].durable, s[1].durable), (Some(1), Some(2)));
        assert_eq!(s[1].possible, vec![2]);
    }

    #[test]
    fn a_failed_write_leaves_both_generations_possible_until_one_is_durable() {
        let s = slots("W 2 1\nU 2 1\nW 2 4\nW 2 5\n");
        assert_eq!(
            (s[2].durable, s[2].possible.clone()),
            (Some(1), vec![1, 4, 5])
        );
        let s = slots("W 2 1\nU 2 1\nW 2 4\nW 2 5\nU 2 5\n");
        assert_eq!(s[2].possible, vec![5]);
    }

    #[test]
    fn a_line_cut_short_by_a_kill_is_ignored_and_garbage_is_refused() {
        let s = slots("W 0 1\nU 0 1\nW 1 2\nU 1");
        assert_eq!((s[0].durable, s[1].durable), (Some(1), None));
        for bad in ["X 1 2\n", "W 9 1\n", "A 0 1\n", "D 7\n", "W 0 x\n"] {
            assert!(replay(&format!("{HEAD}{bad}")).is_err(), "{bad:?}");
        }
        assert!(replay("something else\n").is_err());
        assert!(replay("iscsi-verify-journal 1 bs=4096 block=0 slots=3\n").is_err());
        assert!(replay("").is_err());
    }

    proptest::proptest! {
        /// A journal is a file a user names: any text gets a result or an
        /// error, never a panic, and what replays is consistent.
        #[test]
        fn any_journal_replays_or_is_refused(
            entries in proptest::collection::vec((0u8..6, 0u64..5, 0u32..20), 0..60),
            noise in ".{0,40}",
        ) {
            let mut text = HEAD.to_owned();
            for (kind, slot, n) in entries {
                let kind = ["W", "A", "U", "F", "D", "X"][kind as usize];
                match kind {
                    "F" | "D" => text += &format!("{kind} {n}\n"),
                    _ => text += &format!("{kind} {slot} {n}\n"),
                }
            }
            if let Ok((_, slots)) = replay(&text) {
                for slot in &slots {
                    if let Some(durable) = slot.durable {
                        proptest::prop_assert!(slot.possible.contains(&durable));
                        proptest::prop_assert!(slot.possible.iter().all(|&g| g >= durable));
                    }
                }
            }
            let _ = replay(&format!("{text}{noise}"));
            let _ = replay(&noise);
        }
    }

    #[test]
    fn what_the_journal_writes_replays() {
        let dir = std::env::temp_dir().join(format!("verify-journal-{}", std::process::id()));
        let layout = Layout {
            bs: 4096,
            block: 512,
            slots: 3,
        };
        let journal = Journal::create(&dir, layout).unwrap();
        journal.issued(1, 7).unwrap();
        journal.acknowledged(1, 7, false).unwrap();
        journal.flush_started(1).unwrap();
        journal.flush_done(1).unwrap();
        journal.issued(2, 8).unwrap();
        journal.acknowledged(2, 8, true).unwrap();
        let text = std::fs::read_to_string(&dir).unwrap();
        std::fs::remove_file(&dir).unwrap();
        let (read, s) = replay(&text).unwrap();
        assert_eq!(read, layout);
        assert_eq!((s[1].durable, s[2].durable), (Some(7), Some(8)));
    }
}
