//! Running a SCSI command and answering it: on the connection's own task
//! for a short command on a memory store, else in a task of its own (and
//! on the blocking pool when the store may block).

use super::*;
use crate::qos::Admission;

/// The most data a READ or WRITE may move and still be run to its answer
/// by the connection's reader itself (on a store that never blocks): a
/// 4 KiB read costs less to answer than to hand to another task, whose
/// spawn and cross-thread wake-up were a quarter of the target's CPU at QD
/// 32 (docs/performance.md, "4 KiB reads"). Reads from 64 KiB up are lent
/// from the store (`iscsi_scsi::sbc::LEND_MIN`), and their Data-In can take
/// long enough to send that the reader should go on reading meanwhile.
const INLINE_MAX: u64 = 64 * 1024 - 1;

/// Whether the reader runs and answers `command` itself: a READ or WRITE
/// (6/10/12/16) moving at most [`INLINE_MAX`] bytes, by its CDB and by its
/// Expected Data Transfer Length, on a store that never blocks. Any other
/// command goes to a task of its own: some (WRITE SAME, UNMAP, VERIFY)
/// work on far more of the store than their data says.
fn answered_here(
    store: Option<&Arc<dyn iscsi_scsi::Backstore>>,
    command: &ScsiCommand,
    cdb: &[u8],
) -> bool {
    let Some(store) = store.filter(|store| !store.may_block()) else {
        return false;
    };
    if u64::from(command.expected_data_transfer_length) > INLINE_MAX {
        return false;
    }
    match iscsi_scsi::cdb::parse_rw(cdb) {
        Some(Ok(rw)) => rw.blocks.bytes(store.block_size()) <= INLINE_MAX,
        // Refused with CHECK CONDITION without touching the store.
        Some(Err(_)) => true,
        None => false,
    }
}

impl Connection {
    /// Executes a command and answers it: here, before the next PDU is
    /// read, for a short READ or WRITE on a store that never blocks
    /// ([`answered_here`]); else in a task of its own, which runs a command
    /// for a store that may block on the blocking pool.
    ///
    /// Answered here, the command is over before anything after it on the
    /// connection is looked at: a task management function for it finds no
    /// task, as if it had come a moment later. The reader then waits for
    /// the writer as the answer to a NOP-Out does: if the initiator stops
    /// reading, the target stops reading too (TCP's own back-pressure).
    ///
    /// The SCSI core is reached through the session, never cloned: its
    /// reference count is shared by every session of the target on every
    /// core, and a count written per command was a cache line they all
    /// wrote.
    pub(super) async fn execute(
        &mut self,
        task: Arc<Task>,
        command: ScsiCommand,
        cdb: Vec<u8>,
        data_out: WriteBuffer,
        r2ts: u32,
    ) {
        task.start();
        let guard = self.in_flight.enter();
        let admission = self.admit(&command, &cdb);
        let throttled = !matches!(admission, Admission::Go);
        let (may_block, here, asynchronous) = iscsi_scsi::decode_lun(command.lun.0)
            .and_then(|lun| {
                self.session.scsi.as_ref()?.with_backstore(lun, |store| {
                    // EXTENDED COPY may read and write other LUs than
                    // this one, stores that block among them, and moves
                    // far more than its data; SANITIZE (without IMMED)
                    // writes or frees the whole LU: always off the shard.
                    use iscsi_scsi::cdb::opcode::{EXTENDED_COPY, SANITIZE};
                    let long = matches!(cdb.first(), Some(&EXTENDED_COPY | &SANITIZE));
                    (
                        store.may_block() || long,
                        answered_here(Some(store), &command, &cdb),
                        store.async_io().is_some() && iscsi_scsi::cdb::parse_rw(&cdb).is_some(),
                    )
                })
            })
            .unwrap_or((false, false, false));
        let answer = answer(
            Execution {
                session: Arc::clone(&self.session),
                task,
                command,
                cdb,
                data_out,
                r2ts,
                buffers: Arc::clone(&self.buffers),
                pieces: Arc::clone(&self.pieces),
                tap: self.tap.clone(),
                admission,
            },
            Run {
                may_block,
                asynchronous,
            },
            here && !throttled,
        );
        if here && !throttled {
            self.answers_held = true;
            answer.await;
            drop(guard);
        } else {
            tokio::spawn(async move {
                let _guard = guard;
                answer.await;
            });
        }
    }
}

impl Connection {
    /// What the command's QoS limits say (`crate::qos`): one load of the
    /// table, and nothing more when no target has a limit.
    fn admit(&self, command: &ScsiCommand, cdb: &[u8]) -> Admission {
        let table = self.shared.qos.load();
        if table.is_empty() {
            return Admission::Go;
        }
        let (Some(target), Some(lun)) = (
            self.session.target_name.as_deref(),
            iscsi_scsi::decode_lun(command.lun.0),
        ) else {
            return Admission::Go;
        };
        table.admit(
            target,
            &self.session.initiator_name,
            lun,
            cdb,
            u64::from(command.expected_data_transfer_length),
        )
    }
}

/// Waits for a throttled command's turn, looking every [`ABANDON_POLL`]
/// whether it was aborted meanwhile (then it runs no further, and
/// `respond` sees the abort), so that an ABORT TASK or a reset never waits
/// for a slow limit. Whether it was aborted.
async fn wait_turn(task: &Task, until: std::time::Instant) -> bool {
    loop {
        let now = std::time::Instant::now();
        let aborted = task.aborted.load(Ordering::Acquire);
        if now >= until || aborted {
            return aborted;
        }
        tokio::time::sleep((until - now).min(ABANDON_POLL)).await;
    }
}

/// A command admitted and ready to run, with what answering it needs.
struct Execution {
    /// Its SCSI core is the session's.
    session: Arc<Session>,
    task: Arc<Task>,
    command: ScsiCommand,
    cdb: Vec<u8>,
    data_out: WriteBuffer,
    /// The R2Ts sent for a write (its status's ExpDataSN).
    r2ts: u32,
    buffers: Arc<BufferPool>,
    pieces: Arc<BufferPool>,
    tap: Option<Tap>,
    /// What its QoS limits said: run now, wait, or TASK SET FULL.
    admission: Admission,
}

/// How often an aborted SANITIZE's command looks whether it was aborted
/// (a poll: an abort sets a flag, it does not wake the command).
const ABANDON_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Where a command runs.
struct Run {
    /// On the blocking pool.
    may_block: bool,
    /// A READ or WRITE on a store with asynchronous I/O: on its own task,
    /// waiting for the store without a thread (`planned`).
    asynchronous: bool,
}

/// Runs the command (see [`Run`]) and sends its Data-In and status; `hold`
/// when the connection's reader answers it (`Response::hold`).
async fn answer(mut execution: Execution, how: Run, hold: bool) {
    // Over its limits' queue, nothing runs (SAM-5 5.3.1): TASK SET FULL;
    // aborted while it waited its turn, nothing runs either.
    let skip = match std::mem::replace(&mut execution.admission, Admission::Go) {
        Admission::Go => None,
        Admission::Full => Some(CommandOutcome::TASK_SET_FULL),
        Admission::Wait { until, guard } => {
            let aborted = wait_turn(&execution.task, until).await;
            drop(guard);
            aborted.then_some(CommandOutcome::GOOD)
        }
    };
    let command = &execution.command;
    // Scratch for a READ's data (a lent READ gives it back as it was);
    // other commands build short answers from empty.
    let data_in = match skip {
        None if command.read => execution
            .buffers
            .take_filled(command.expected_data_transfer_length as usize),
        _ => Vec::new(),
    };
    let data_out = std::mem::take(&mut execution.data_out);
    let written = data_out.len() as u64;
    let ran = match skip {
        Some(outcome) => Some((outcome, Residual::NONE, data_out, data_in, Vec::new())),
        None => {
            let cdb = std::mem::take(&mut execution.cdb);
            run(&execution, how, cdb, data_out, data_in).await
        }
    };
    let Execution {
        session,
        task,
        command,
        r2ts,
        buffers,
        pieces,
        tap,
        ..
    } = execution;
    let Some((outcome, residual, data_out, data_in, lent)) = ran else {
        // The blocking task panicked: a bug, reported; the command ends
        // without status (the initiator times out).
        warn!("command execution failed");
        session.finish(&task);
        return;
    };
    SessionStats::add(&session.stats.commands, 1);
    if outcome.status != GOOD {
        SessionStats::add(&session.stats.errors, 1);
    }
    // Handed to the datamover as shared bytes: the backstore's own memory
    // when it lent it (sent with no copy; a write meanwhile copies the
    // chunks instead of changing them), else the buffer, which returns to
    // the pool when the last byte sent from it (iSER's RDMA Writes) is on
    // the wire. Lent whole chunks carry their CRC32C, so a data digest over
    // them is combined, not computed (`Gather::crc32c`).
    let data_in = if lent.is_empty() {
        Gather::from(PooledBuffer::new(data_in, Arc::clone(&buffers)).into_bytes())
    } else {
        buffers.give(data_in);
        Gather::from_pieces_with_crcs(lent.into_iter().map(|l| (l.bytes, l.crc)))
    };
    let response = Response {
        command: &command,
        outcome,
        data_in: data_in.clone(),
        residual,
        r2ts,
        written: if command.write { written } else { 0 },
        tap: tap.as_ref(),
        hold,
    };
    if let Err(error) = respond(&session, &task, response).await {
        debug!(%error, "response not sent");
    }
    data_out.give(&buffers, &pieces);
}

/// What running a command gave: its outcome and residual, the write's
/// buffer back, the READ's data (or its scratch), and what the store lent.
type Ran = (
    CommandOutcome,
    Residual,
    WriteBuffer,
    Vec<u8>,
    Vec<iscsi_scsi::Lent>,
);

/// Runs the command (see [`Run`]); `None` when the blocking task running it
/// panicked.
async fn run(
    e: &Execution,
    how: Run,
    cdb: Vec<u8>,
    data_out: WriteBuffer,
    data_in: Vec<u8>,
) -> Option<Ran> {
    let Run {
        may_block,
        asynchronous,
    } = how;
    let Execution {
        session,
        task,
        command,
        buffers,
        pieces,
        tap,
        ..
    } = e;
    let itt = command.initiator_task_tag;
    let (data_out, data_in) = if asynchronous {
        let started = tap.as_ref().map(|_| std::time::Instant::now());
        let ran = planned::run(
            session, task, command, &cdb, data_out, data_in, buffers, pieces,
        )
        .await;
        match ran {
            Ok(ran) => {
                if let (Some(tap), Some(started)) = (&tap, started) {
                    tap.step("execute", itt, started, std::time::Instant::now());
                }
                let empty = WriteBuffer::default();
                return Some((ran.outcome, ran.residual, empty, ran.data_in, Vec::new()));
            }
            Err(back) => back,
        }
    } else {
        (data_out, data_in)
    };
    let sanitize = cdb.first() == Some(&iscsi_scsi::cdb::opcode::SANITIZE);
    let watched = Arc::clone(task);
    let run = {
        let command = command.clone();
        let session = Arc::clone(session);
        let task = Arc::clone(task);
        let tap = tap.clone();
        // The steps a trace shows between the command's PDUs: the hand-off
        // to the blocking pool, then the SCSI execution (CDB, backstore)
        // itself.
        let queued = tap.as_ref().map(|_| std::time::Instant::now());
        let work = move || {
            let started = tap.as_ref().map(|tap| {
                let now = std::time::Instant::now();
                if let (true, Some(queued)) = (may_block, queued) {
                    tap.step("wait for blocking pool", itt, queued, now);
                }
                now
            });
            let mut data_in = data_in;
            let mut data_out = data_out;
            let mut lent = Vec::new();
            // Aborted while it waited for a thread: it never reaches the
            // SCSI layer, so the abort is not held up by a slow store (no
            // status goes out: `respond` sees the abort).
            let (outcome, residual) = match session.scsi.as_deref() {
                Some(_) if task.aborted.load(Ordering::Acquire) => {
                    (CommandOutcome::GOOD, Residual::NONE)
                }
                // A discovery session's commands are refused before here.
                None => (
                    CommandOutcome::check_condition(iscsi_scsi::Sense::INVALID_OPCODE),
                    Residual::NONE,
                ),
                Some(scsi) => run_command(
                    scsi,
                    &session.nexus,
                    &command,
                    &cdb,
                    &mut data_out,
                    &mut data_in,
                    &mut lent,
                ),
            };
            if let (Some(tap), Some(started)) = (&tap, started) {
                tap.step("execute", itt, started, std::time::Instant::now());
            }
            (outcome, residual, data_out, data_in, lent)
        };
        if may_block && sanitize {
            // A SANITIZE goes on after its task is aborted or reset
            // (SBC-4 4.11.2; LUN and target resets, a lost nexus): the
            // command ends at the abort while the operation finishes on
            // its thread, gating the LU meanwhile. Without this, an ABORT
            // TASK, a reset or a logout would wait for the whole overwrite.
            let mut running = tokio::task::spawn_blocking(work);
            loop {
                tokio::select! {
                    done = &mut running => break done,
                    () = tokio::time::sleep(ABANDON_POLL) => {
                        if watched.aborted.load(Ordering::Acquire) {
                            let empty = WriteBuffer::flat(buffers, 0);
                            break Ok((CommandOutcome::GOOD, Residual::NONE, empty, Vec::new(), Vec::new()));
                        }
                    }
                }
            }
        } else if may_block {
            tokio::task::spawn_blocking(work).await
        } else {
            // Memory only: no thread hand-off (a 4 KiB command costs less
            // than moving it to the blocking pool and back).
            Ok(work())
        }
    };
    run.ok()
}

/// Executes one command against the SCSI target. For a write, the data the
/// CDB asks for (SPDTL) is compared with what the initiator sent (EDTL,
/// RFC 7143 11.4.5.1): less is an underflow and the surplus is ignored;
/// more is an overflow, answered with CHECK CONDITION INVALID FIELD IN
/// INFORMATION UNIT without writing anything.
fn run_command(
    scsi: &ScsiTarget,
    nexus: &Nexus,
    command: &ScsiCommand,
    cdb: &[u8],
    data_out: &mut WriteBuffer,
    data_in: &mut Vec<u8>,
    lent: &mut Vec<iscsi_scsi::Lent>,
) -> (CommandOutcome, Residual) {
    let data_out = data_out_view(data_out);
    let expected = command.expected_data_transfer_length;
    if command.write {
        let (residual, wanted, block_size) = write_residual(scsi, command, cdb);
        if residual.overflow {
            // FCP-4 / SAM-5: process the command, but transfer no data
            // beyond the EDTL: a READ/WRITE is cut to the whole blocks the
            // initiator sent; any other command is refused.
            data_in.clear();
            let blocks = expected / block_size.max(1);
            return match shorten_transfer(cdb, blocks) {
                Some(None) => (CommandOutcome::GOOD, residual),
                Some(Some(shorter)) => {
                    let used = data_out.shortened((blocks * block_size) as usize);
                    (
                        scsi.execute_lending(nexus, command.lun.0, &shorter, used, data_in, lent),
                        residual,
                    )
                }
                None => {
                    let sense = iscsi_scsi::Sense::new(
                        iscsi_scsi::SenseKey::IllegalRequest,
                        iscsi_scsi::Asc::new(0x0E, 0x03),
                    );
                    (CommandOutcome::check_condition(sense), residual)
                }
            };
        }
        let exact = matches!(
            cdb.first(),
            Some(&(COMPARE_AND_WRITE | WRITE_SAME_10 | WRITE_SAME_16))
        );
        if residual.underflow && exact {
            // The compare and the write halves are located by the CDB's
            // block count: a Data-Out of another size cannot be split
            // (what Linux's target and libiscsi's suite expect). WRITE
            // SAME's Data-Out is one block, or none with NDOB: more is
            // not a block (libiscsi's WriteSame*.InvalidDataOutSize).
            data_in.clear();
            let outcome = CommandOutcome::check_condition(iscsi_scsi::Sense::INVALID_FIELD_IN_CDB);
            return (outcome, residual);
        }
        let used = data_out.shortened(wanted as usize);
        let outcome = scsi.execute_lending(nexus, command.lun.0, cdb, used, data_in, lent);
        return (outcome, residual);
    }
    let outcome = scsi.execute_lending(nexus, command.lun.0, cdb, DataOut::NONE, data_in, lent);
    let sent = if lent.is_empty() {
        data_in.len()
    } else {
        lent.iter().map(|l| l.bytes.len()).sum()
    };
    (outcome, Residual::of_data_in(command, sent))
}

/// A write's Data-Out as the SCSI layer takes it: one buffer, or pieces.
pub(super) fn data_out_view(data_out: &mut WriteBuffer) -> DataOut<'_> {
    let len = data_out.len();
    if data_out.is_flat() {
        DataOut::Flat(data_out.flat_mut().map_or(&[][..], |b| &b[..]))
    } else {
        DataOut::Pieces {
            pieces: data_out.pieces_mut(),
            len,
        }
    }
}

/// For a write: the residual of the data its CDB asks for (SPDTL) against
/// the Expected Data Transfer Length, that SPDTL, and the LU's block size.
pub(super) fn write_residual(
    scsi: &ScsiTarget,
    command: &ScsiCommand,
    cdb: &[u8],
) -> (Residual, u32, u32) {
    let block_size = iscsi_scsi::decode_lun(command.lun.0)
        .and_then(|lun| scsi.with_backstore(lun, |b| b.block_size()))
        .unwrap_or(512);
    let (_, wanted) = iscsi_scsi::command_info(cdb, block_size);
    let residual = Residual::of(u64::from(wanted), command.expected_data_transfer_length);
    (residual, wanted, block_size)
}

/// For a write CDB (WRITE and WRITE AND VERIFY 6/10/12/16), the same CDB
/// with TRANSFER LENGTH cut to `blocks`: `Some(None)` when that leaves
/// nothing to do, `None` for any other command.
fn shorten_transfer(cdb: &[u8], blocks: u32) -> Option<Option<Vec<u8>>> {
    let (at, width) = match *cdb.first()? {
        0x0A => (4, 1),
        0x2A | 0x2E => (7, 2),
        0xAA | 0xAE => (6, 4),
        0x8A | 0x8E => (10, 4),
        _ => return None,
    };
    if cdb.len() < at + width {
        return None;
    }
    if blocks == 0 {
        return Some(None);
    }
    let mut shorter = cdb.to_vec();
    let bytes = blocks.to_be_bytes();
    shorter[at..at + width].copy_from_slice(&bytes[4 - width..]);
    Some(Some(shorter))
}
