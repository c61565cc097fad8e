//! SCSI target core: a target's logical units, SPC-4/SBC-3 disk emulation
//! over [`Backstore`]s, and sense data.
//!
//! The transport (the iSCSI target driver) asks [`command_info`] how much data
//! a CDB moves, collects any Data-Out, then calls [`ScsiTarget::execute`],
//! which writes Data-In into a buffer the caller reuses from command to
//! command. Nothing here does network I/O, and nothing panics on any CDB,
//! LUN or data the network can send.
//!
//! Every command names its I_T nexus ([`Nexus`]): unit attentions,
//! SPC-2 reservations and persistent reservations are kept per nexus. The
//! transport reports lost nexuses ([`ScsiTarget::nexus_lost`]) and the task
//! management resets ([`ScsiTarget::lun_reset`], [`ScsiTarget::target_reset`]).
//!
//! | module | owns |
//! |---|---|
//! | `lib.rs` | this table and the exports: no module imports the crate root |
//! | `target.rs` | [`ScsiTarget`]: the LUN table, adding and removing LUNs while commands run, the known nexuses, resets |
//! | `outcome.rs`, `lun.rs` | [`CommandOutcome`] and [`status`]; LUN addressing ([`encode_lun`], [`decode_lun`]) |
//! | `dispatch.rs` | [`ScsiTarget::execute`], [`ScsiTarget::execute_lending`], [`ScsiTarget::plan_io`]: finding a command's LU, then one command on its LU: the checks (unit attentions, CONTROL, sanitize, reservations, medium, ALUA) as one step, then plan or run, then the opcode table (primary, block) |
//! | `lu.rs` | per-LU state: unit attention queues per nexus, the SPC-2 reservation, PR state, mode parameters, the removable medium, the COMPARE AND WRITE lock |
//! | [`medium`] | [`LuOptions`] (read-only, removable, physical block size) and the removable medium's load/eject and prevent state |
//! | [`nexus`] | [`Nexus`], [`NexusKey`], iSCSI TransportIDs (SPC-4 §7.6.4.6) |
//! | [`cdb`] | opcodes, bounds-checked field readers, [`cdb::Lba`]/[`cdb::Blocks`], READ/WRITE decoding, [`command_info`] (Data-Out and allocation lengths of every command) |
//! | [`sense`] | the `iscsi-sense` crate, re-exported: sense keys, named ASC/ASCQ constants, INFORMATION, fixed and descriptor formats (a crate of its own because the initiator reads sense data too) |
//! | [`spc`] | primary commands: INQUIRY and VPD pages (00h, 80h, 83h, B0h, B1h, B2h), REPORT LUNS, TEST UNIT READY, REQUEST SENSE |
//! | [`mode`] | MODE SENSE(6/10), MODE SELECT(6/10): caching, control, informational exceptions pages |
//! | [`pr`] | RESERVE/RELEASE(6/10), PERSISTENT RESERVE IN/OUT, the reservation conflict rules; `pr_state.rs` the state they change |
//! | `pr_shared.rs`, [`pr_record`] | persistent reservations shared by a gateway group over any store that offers a [`SharedPrStore`] (today `iscsi-ceph`'s RBD), and the versioned record they keep in it |
//! | [`sbc`] | block commands: READ/WRITE(6/10/12/16), READ CAPACITY(10/16), GET LBA STATUS, SYNCHRONIZE CACHE(10/16), UNMAP, WRITE SAME(10/16), COMPARE AND WRITE, VERIFY(10/12/16), WRITE AND VERIFY(10/12/16), START STOP UNIT, PREVENT ALLOW MEDIUM REMOVAL |
//! | [`xcopy`] | EXTENDED COPY (LID1) between this target's LUs and RECEIVE COPY RESULTS; `xcopy/parse.rs` the parameter list, `xcopy_state.rs` the statuses held for COPY STATUS |
//! | [`alua`] | implicit ALUA for an LU several gateways serve: the [`alua::AluaGroup`] its store hands it, TPGS and the port designators in INQUIRY, REPORT TARGET PORT GROUPS, the standby/transitioning gate, ASYMMETRIC ACCESS STATE CHANGED |
//! | [`atomic`] | WRITE ATOMIC(16) and the atomic limits of the Block Limits page (SBC-4 §4.29, §5.48), from what each store promises |
//! | [`sanitize`] | SANITIZE OVERWRITE, BLOCK ERASE, EXIT FAILURE MODE (SBC-4 §4.11, §5.30); `sanitize_state.rs` the LU's sanitize state that gates other commands |
//! | [`opcodes`] | the table of supported commands; REPORT SUPPORTED OPERATION CODES, REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS |
//! | `data_out.rs` | [`DataOut`]: a command's Data-Out, in one buffer or in pieces a WRITE hands to [`Backstore::write_pieces`] |
//! | [`backstore`] | the [`Backstore`] trait, [`AsyncIo`], the shared reservation store's trait; the stores themselves are in `iscsi-stores` and `iscsi-ceph` |
//! | `test_store.rs` | the unit tests' store (the real stores depend on this crate; the integration tests in `tests/` use them) |

pub mod alua;
pub mod atomic;
pub mod backstore;
pub mod cdb;
mod data_out;
mod dispatch;
mod lu;
mod lun;
pub mod medium;
pub mod mode;
pub mod nexus;
pub mod opcodes;
mod outcome;
mod planned;
pub mod pr;
pub mod pr_record;
mod pr_shared;
pub(crate) mod pr_state;
pub mod sanitize;
mod sanitize_state;
pub mod sbc;
/// Sense data: the `iscsi-sense` crate, which the initiator shares, so that
/// `iscsi_scsi::sense::...` and the crate-internal `iscsi_sense::...` paths
/// name the same types.
pub use iscsi_sense as sense;
pub mod spc;
mod target;
#[cfg(test)]
mod test_cluster;
#[cfg(test)]
mod test_store;
pub mod xcopy;
mod xcopy_state;

pub use backstore::{
    Allocation, AsyncIo, Backstore, BackstoreOpenError, IoFuture, Lent, PrEvent, PrEventHandler,
    SharedPrStore, WriteData,
};
pub use cdb::{DataDirection, command_info};
pub use data_out::DataOut;
pub use lun::{MAX_LUNS, decode_lun, encode_lun};
pub use medium::LuOptions;
pub use nexus::{Nexus, NexusKey};
pub use outcome::{CommandOutcome, status};
pub use planned::{Planned, PlannedIo};
pub use pr::PrType;
pub use sbc::Transfer;
pub use sense::{Asc, FieldPointer, Sense, SenseKey};
pub use spc::TargetIdentity;
pub use target::{AbortHandler, LunChangeError, Resized, ScsiTarget, TargetReset};
