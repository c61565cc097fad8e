//! The ublk UAPI (`include/uapi/linux/ublk_cmd.h`) as byte layouts of our
//! own: the structures the driver reads from and writes to our memory,
//! each with named field offsets and an encoder or decoder, and the command
//! numbers. Written by hand rather than generated (bindgen needs libclang
//! at build time, which a machine with only a Rust toolchain lacks); the
//! test `layouts_match_the_installed_kernel_header` compiles a C program
//! against the installed header and checks every offset, size and number
//! here against it.
//!
//! All structures are native-endian: the driver and we share a machine.
//!
//! ```text
//! struct ublksrv_ctrl_cmd (32 bytes, the first bytes of an SQE128's command area)
//!  0      4        6    8              16             24          26    28         32
//!  +------+--------+----+--------------+--------------+-----------+-----+----------+
//!  |dev_id|queue_id|len |addr          |data[0]       |dev_path_len| pad |reserved  |
//!  +------+--------+----+--------------+--------------+-----------+-----+----------+
//!
//! struct ublksrv_io_cmd (16 bytes, an SQE's command area)
//!  0    2    4      8              16
//!  +----+----+------+--------------+
//!  |q_id|tag |result|addr          |
//!  +----+----+------+--------------+
//!
//! struct ublksrv_io_desc (24 bytes, one per tag in the queue's mapped array)
//!  0        4          8              16             24
//!  +--------+----------+--------------+--------------+
//!  |op_flags|nr_sectors|start_sector  |addr          |
//!  +--------+----------+--------------+--------------+
//! ```

/// `_IOC` direction bits: the kernel writes the argument (`_IOR`).
const IOC_READ: u32 = 2;
/// `_IOC` direction bits: the kernel reads the argument (`_IOW`).
const IOC_WRITE: u32 = 1;
/// The ioctl type of every ublk command, `'u'`.
const IOC_TYPE: u32 = b'u' as u32;

/// Size of `struct ublksrv_ctrl_cmd`.
pub const CTRL_CMD_LEN: usize = 32;
/// Size of `struct ublksrv_io_cmd`.
pub const IO_CMD_LEN: usize = 16;
/// Size of `struct ublksrv_io_desc`.
pub const IO_DESC_LEN: usize = 24;
/// Size of `struct ublksrv_ctrl_dev_info`.
pub const DEV_INFO_LEN: usize = 64;
/// Bytes of `struct ublk_params` we send: `len`, `types`, `basic` and
/// `discard` (what Linux 6.1's header holds; later parts are left zero).
pub const PARAMS_LEN: usize = 64;
/// The GET_FEATURES answer: a `u64` of `UBLK_F_*` bits.
pub const FEATURES_LEN: usize = 8;

/// Most tags per queue (`UBLK_MAX_QUEUE_DEPTH`).
pub const MAX_QUEUE_DEPTH: u16 = 4096;
/// Where queue 0's descriptor array is mapped (`UBLKSRV_CMD_BUF_OFFSET`).
const CMD_BUF_OFFSET: u64 = 0;
/// Where the user-copy window of request data starts
/// (`UBLKSRV_IO_BUF_OFFSET`).
const IO_BUF_OFFSET: u64 = 0x8000_0000;
/// Bits of the byte offset inside one request (`UBLK_IO_BUF_BITS`); the
/// tag sits above it (`UBLK_TAG_OFF`).
const TAG_OFF: u32 = 25;
/// `UBLK_QID_OFF`: the queue above the 16 tag bits.
const QID_OFF: u32 = TAG_OFF + 16;

/// `UBLK_F_USER_COPY`: request data is read and written with pread/pwrite
/// on the character device instead of a buffer registered per tag.
pub const F_USER_COPY: u64 = 1 << 7;

/// `UBLK_IO_RES_OK`: the tag's command completed with a new request.
pub const IO_RES_OK: i32 = 0;
/// `UBLK_IO_RES_ABORT` (`-ENODEV`): the device is going away; the tag is
/// done.
pub const IO_RES_ABORT: i32 = -libc::ENODEV;

/// `UBLK_PARAM_TYPE_BASIC`.
pub const PARAM_TYPE_BASIC: u32 = 1 << 0;
/// `UBLK_PARAM_TYPE_DISCARD`.
pub const PARAM_TYPE_DISCARD: u32 = 1 << 1;
/// `UBLK_ATTR_READ_ONLY`.
pub const ATTR_READ_ONLY: u32 = 1 << 0;
/// `UBLK_ATTR_VOLATILE_CACHE`: the kernel sends FLUSH.
pub const ATTR_VOLATILE_CACHE: u32 = 1 << 2;
/// `UBLK_ATTR_FUA`: the kernel sends FUA writes.
pub const ATTR_FUA: u32 = 1 << 3;

/// A control command (`UBLK_CMD_*` / `UBLK_U_CMD_*`), issued on
/// `/dev/ublk-control`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtrlOp {
    /// Read a device's `ublksrv_ctrl_dev_info`.
    GetDevInfo,
    /// Create a device from a `ublksrv_ctrl_dev_info`.
    AddDev,
    /// Remove a device (waits until nothing holds it).
    DelDev,
    /// Expose the block device (waits until every tag is fetched).
    StartDev,
    /// Remove the block device and abort the server's commands.
    StopDev,
    /// Set `ublk_params`.
    SetParams,
    /// The driver's `UBLK_F_*` (Linux 6.5+; ioctl-encoded only).
    GetFeatures,
}

impl CtrlOp {
    /// The command number and whether the driver writes the argument only
    /// (`_IOR`) or reads it too (`_IOWR`), as the header defines each.
    fn number(self) -> (u32, u32) {
        match self {
            CtrlOp::GetDevInfo => (0x02, IOC_READ),
            CtrlOp::AddDev => (0x04, IOC_READ | IOC_WRITE),
            CtrlOp::DelDev => (0x05, IOC_READ | IOC_WRITE),
            CtrlOp::StartDev => (0x06, IOC_READ | IOC_WRITE),
            CtrlOp::StopDev => (0x07, IOC_READ | IOC_WRITE),
            CtrlOp::SetParams => (0x08, IOC_READ | IOC_WRITE),
            CtrlOp::GetFeatures => (0x13, IOC_READ),
        }
    }
}

/// An I/O command (`UBLK_IO_*` / `UBLK_U_IO_*`), issued on the device's
/// character device by the queue's thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    /// Give the driver a tag to put a request in.
    Fetch,
    /// Answer the tag's request and fetch its next one.
    CommitAndFetch,
}

/// How command numbers are written: ioctl-encoded (Linux 6.4+, required
/// where the legacy numbers are compiled out) or the plain legacy number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// `_IOWR('u', nr, struct ...)`.
    Ioctl,
    /// `nr` alone.
    Legacy,
}

/// `_IOC(dir, 'u', nr, size)`.
fn ioc(dir: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | (IOC_TYPE << 8) | nr
}

impl Encoding {
    /// The `cmd_op` of control command `op`.
    pub fn ctrl(self, op: CtrlOp) -> u32 {
        let (nr, dir) = op.number();
        match self {
            Encoding::Ioctl => ioc(dir, nr, CTRL_CMD_LEN),
            Encoding::Legacy => nr,
        }
    }

    /// The `cmd_op` of I/O command `op`.
    pub fn io(self, op: IoOp) -> u32 {
        let nr = match op {
            IoOp::Fetch => 0x20,
            IoOp::CommitAndFetch => 0x21,
        };
        match self {
            Encoding::Ioctl => ioc(IOC_READ | IOC_WRITE, nr, IO_CMD_LEN),
            Encoding::Legacy => nr,
        }
    }
}

/// `struct ublksrv_ctrl_cmd` with its buffer's address left to the caller
/// (who owns the buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtrlCmd {
    /// The device (`u32::MAX`: any free id, for ADD_DEV).
    pub dev_id: u32,
    /// `u16::MAX` unless the command is for one queue.
    pub queue_id: u16,
    /// Bytes of the command's buffer (0: none).
    pub len: u16,
    /// The inline argument `data[0]` (START_DEV: the server's PID).
    pub data: u64,
}

impl CtrlCmd {
    /// A command for device `dev_id` with no buffer and no data.
    pub fn for_device(dev_id: u32) -> CtrlCmd {
        CtrlCmd {
            dev_id,
            queue_id: u16::MAX,
            len: 0,
            data: 0,
        }
    }

    /// The 80-byte command area of an SQE128, with `addr` as the buffer.
    pub fn emit(&self, addr: u64) -> [u8; 80] {
        let mut b = [0u8; 80];
        b[0..4].copy_from_slice(&self.dev_id.to_ne_bytes());
        b[4..6].copy_from_slice(&self.queue_id.to_ne_bytes());
        b[6..8].copy_from_slice(&self.len.to_ne_bytes());
        b[8..16].copy_from_slice(&addr.to_ne_bytes());
        b[16..24].copy_from_slice(&self.data.to_ne_bytes());
        b
    }
}

/// `struct ublksrv_io_cmd` as sent: no buffer address (user copy).
pub fn io_cmd(q_id: u16, tag: u16, result: i32) -> [u8; IO_CMD_LEN] {
    let mut b = [0u8; IO_CMD_LEN];
    b[0..2].copy_from_slice(&q_id.to_ne_bytes());
    b[2..4].copy_from_slice(&tag.to_ne_bytes());
    b[4..8].copy_from_slice(&result.to_ne_bytes());
    b
}

/// `struct ublksrv_io_desc`: what the driver asks of one tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoDesc {
    /// Operation (bits 0-7) and flags (`UBLK_IO_F_*`).
    pub op_flags: u32,
    /// 512-byte sectors.
    pub nr_sectors: u32,
    /// First 512-byte sector.
    pub start_sector: u64,
}

impl IoDesc {
    /// Decodes one descriptor.
    pub fn parse(b: &[u8; IO_DESC_LEN]) -> IoDesc {
        IoDesc {
            op_flags: u32::from_ne_bytes(b[0..4].try_into().unwrap_or_default()),
            nr_sectors: u32::from_ne_bytes(b[4..8].try_into().unwrap_or_default()),
            start_sector: u64::from_ne_bytes(b[8..16].try_into().unwrap_or_default()),
        }
    }
}

/// `struct ublksrv_ctrl_dev_info`: the device as created (ADD_DEV writes
/// back what it made of our request: its id, queues clamped to the CPUs,
/// the I/O size aligned, the flags it supports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DevInfo {
    /// Hardware queues.
    pub nr_hw_queues: u16,
    /// Tags per queue.
    pub queue_depth: u16,
    /// `UBLK_S_DEV_*`.
    pub state: u16,
    /// Largest request, bytes.
    pub max_io_buf_bytes: u32,
    /// The device id: N of `/dev/ublkbN`.
    pub dev_id: u32,
    /// The serving process.
    pub ublksrv_pid: i32,
    /// `UBLK_F_*`.
    pub flags: u64,
}

impl DevInfo {
    /// The 64-byte structure.
    pub fn emit(&self) -> [u8; DEV_INFO_LEN] {
        let mut b = [0u8; DEV_INFO_LEN];
        b[0..2].copy_from_slice(&self.nr_hw_queues.to_ne_bytes());
        b[2..4].copy_from_slice(&self.queue_depth.to_ne_bytes());
        b[4..6].copy_from_slice(&self.state.to_ne_bytes());
        b[8..12].copy_from_slice(&self.max_io_buf_bytes.to_ne_bytes());
        b[12..16].copy_from_slice(&self.dev_id.to_ne_bytes());
        b[16..20].copy_from_slice(&self.ublksrv_pid.to_ne_bytes());
        b[24..32].copy_from_slice(&self.flags.to_ne_bytes());
        b
    }

    /// Decodes the structure (`None` when `b` is too short).
    pub fn parse(b: &[u8]) -> Option<DevInfo> {
        let b = b.get(..DEV_INFO_LEN)?;
        let u16_at = |at: usize| u16::from_ne_bytes([b[at], b[at + 1]]);
        let u32_at = |at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().unwrap_or_default());
        Some(DevInfo {
            nr_hw_queues: u16_at(0),
            queue_depth: u16_at(2),
            state: u16_at(4),
            max_io_buf_bytes: u32_at(8),
            dev_id: u32_at(12),
            ublksrv_pid: u32_at(16) as i32,
            flags: u64::from_ne_bytes(b[24..32].try_into().unwrap_or_default()),
        })
    }
}

/// `struct ublk_param_basic` and `struct ublk_param_discard` inside
/// `struct ublk_params`, in the driver's units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Params {
    /// `UBLK_PARAM_TYPE_*` present.
    pub types: u32,
    /// `UBLK_ATTR_*`.
    pub attrs: u32,
    /// log2 of the logical block size.
    pub logical_bs_shift: u8,
    /// log2 of the physical block size.
    pub physical_bs_shift: u8,
    /// log2 of the optimal I/O size.
    pub io_opt_shift: u8,
    /// log2 of the minimal I/O size.
    pub io_min_shift: u8,
    /// Sectors per request.
    pub max_sectors: u32,
    /// Device size in sectors.
    pub dev_sectors: u64,
    /// Bytes before the first discard granule.
    pub discard_alignment: u32,
    /// Bytes per discard granule.
    pub discard_granularity: u32,
    /// Sectors per discard.
    pub max_discard_sectors: u32,
    /// Sectors per WRITE_ZEROES.
    pub max_write_zeroes_sectors: u32,
    /// Ranges per discard.
    pub max_discard_segments: u16,
}

impl Params {
    /// The first [`PARAMS_LEN`] bytes of `struct ublk_params`.
    pub fn emit(&self) -> [u8; PARAMS_LEN] {
        let mut b = [0u8; PARAMS_LEN];
        b[0..4].copy_from_slice(&(PARAMS_LEN as u32).to_ne_bytes());
        b[4..8].copy_from_slice(&self.types.to_ne_bytes());
        // basic, at 8
        b[8..12].copy_from_slice(&self.attrs.to_ne_bytes());
        b[12] = self.logical_bs_shift;
        b[13] = self.physical_bs_shift;
        b[14] = self.io_opt_shift;
        b[15] = self.io_min_shift;
        b[16..20].copy_from_slice(&self.max_sectors.to_ne_bytes());
        // chunk_sectors (20..24) and virt_boundary_mask (32..40) stay 0.
        b[24..32].copy_from_slice(&self.dev_sectors.to_ne_bytes());
        // discard, at 40
        b[40..44].copy_from_slice(&self.discard_alignment.to_ne_bytes());
        b[44..48].copy_from_slice(&self.discard_granularity.to_ne_bytes());
        b[48..52].copy_from_slice(&self.max_discard_sectors.to_ne_bytes());
        b[52..56].copy_from_slice(&self.max_write_zeroes_sectors.to_ne_bytes());
        b[56..58].copy_from_slice(&self.max_discard_segments.to_ne_bytes());
        b
    }
}

/// Where queue `qid`'s descriptor array is mapped from the character
/// device: each queue has room for [`MAX_QUEUE_DEPTH`] descriptors, rounded
/// up to pages (`ublk_max_cmd_buf_size` in the driver).
pub fn descriptors_offset(qid: u16, page_size: usize) -> u64 {
    let per_queue = (usize::from(MAX_QUEUE_DEPTH) * IO_DESC_LEN).next_multiple_of(page_size);
    CMD_BUF_OFFSET + u64::from(qid) * per_queue as u64
}

/// Bytes mapped for a queue of `depth` tags (whole pages).
pub fn descriptors_len(depth: u16, page_size: usize) -> usize {
    (usize::from(depth) * IO_DESC_LEN).next_multiple_of(page_size)
}

/// The character device's file offset of byte 0 of request `(qid, tag)`'s
/// data, for pread (a WRITE's data) and pwrite (a READ's).
pub fn user_copy_offset(qid: u16, tag: u16) -> u64 {
    IO_BUF_OFFSET + (u64::from(qid) << QID_OFF) + (u64::from(tag) << TAG_OFF)
}

#[cfg(test)]
mod tests;
