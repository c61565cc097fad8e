//! The control device, `/dev/ublk-control`: creating, starting, stopping and
//! deleting ublk devices, and asking the driver what it supports. Each
//! operation is one command on a small ring of our own, waited for in the
//! calling thread (START_DEV waits in the kernel until every tag of every
//! queue has been fetched, so it is called from a thread that serves none).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use super::sys::{self, ControlRing};
use super::uapi::{
    CtrlCmd, CtrlOp, DEV_INFO_LEN, DevInfo, Encoding, F_USER_COPY, FEATURES_LEN, Params,
};

/// An open control device and its ring.
pub struct Control {
    file: File,
    ring: ControlRing,
    /// The driver's `UBLK_F_*`, asked once at open; `None` before Linux
    /// 6.5, whose driver has no GET_FEATURES.
    features: Option<u64>,
}

impl Control {
    /// The control device `file` (normally [`super::CONTROL`], opened read
    /// and write), with a ring of its own; asks the driver what it supports.
    pub fn new(file: File) -> io::Result<Control> {
        let ring = ControlRing::builder().build(4)?;
        let mut control = Control {
            file,
            ring,
            features: None,
        };
        control.features = control.query_features().ok();
        Ok(control)
    }

    /// How this driver's command numbers are written (I/O commands too):
    /// ioctl-encoded where the driver answers GET_FEATURES (Linux 6.5+,
    /// which every driver with user copy is), the legacy numbers otherwise.
    pub fn encoding(&self) -> Encoding {
        match self.features {
            Some(_) => Encoding::Ioctl,
            None => Encoding::Legacy,
        }
    }

    /// Runs `op` for `cmd`; the driver's answer as a Result, and the buffer.
    fn command(
        &mut self,
        op: CtrlOp,
        cmd: CtrlCmd,
        buffer: Option<Box<[u8]>>,
    ) -> io::Result<Option<Box<[u8]>>> {
        let cmd_op = match op {
            // Only ever ioctl-encoded: there is no legacy number for it.
            CtrlOp::GetFeatures => Encoding::Ioctl.ctrl(op),
            _ => self.encoding().ctrl(op),
        };
        let (res, buffer) =
            sys::control(&mut self.ring, self.file.as_raw_fd(), cmd_op, cmd, buffer)?;
        if res < 0 {
            return Err(io::Error::from_raw_os_error(-res));
        }
        Ok(buffer)
    }

    /// GET_FEATURES: the driver's `UBLK_F_*` (fails before Linux 6.5).
    fn query_features(&mut self) -> io::Result<u64> {
        let buffer = vec![0u8; FEATURES_LEN].into_boxed_slice();
        let back = self.command(
            CtrlOp::GetFeatures,
            CtrlCmd::for_device(u32::MAX),
            Some(buffer),
        )?;
        let bytes = back.as_deref().and_then(|b| b.get(..FEATURES_LEN));
        let bytes: [u8; FEATURES_LEN] = bytes
            .and_then(|b| b.try_into().ok())
            .ok_or(io::ErrorKind::InvalidData)?;
        Ok(u64::from_ne_bytes(bytes))
    }

    /// Whether the driver serves devices with user copy (Linux 6.5+): the
    /// only kind this driver makes.
    pub fn supports_user_copy(&self) -> bool {
        self.features.is_some_and(|f| f & F_USER_COPY != 0)
    }

    /// Creates a device as `wanted` says (`dev_id` `u32::MAX`: any free id)
    /// and returns what the driver made of it.
    pub fn add(&mut self, wanted: &DevInfo) -> io::Result<DevInfo> {
        let buffer: Box<[u8]> = Box::new(wanted.emit());
        let cmd = CtrlCmd::for_device(wanted.dev_id);
        let back = self.command(CtrlOp::AddDev, cmd, Some(buffer))?;
        back.as_deref()
            .and_then(DevInfo::parse)
            .ok_or_else(|| io::ErrorKind::InvalidData.into())
    }

    /// Device `id` as the driver knows it (its server's PID, its state).
    pub fn dev_info(&mut self, id: u32) -> io::Result<DevInfo> {
        let buffer = vec![0u8; DEV_INFO_LEN].into_boxed_slice();
        let back = self.command(CtrlOp::GetDevInfo, CtrlCmd::for_device(id), Some(buffer))?;
        back.as_deref()
            .and_then(DevInfo::parse)
            .ok_or_else(|| io::ErrorKind::InvalidData.into())
    }

    /// Sets device `id`'s parameters (before it starts).
    pub fn set_params(&mut self, id: u32, params: &Params) -> io::Result<()> {
        let buffer: Box<[u8]> = Box::new(params.emit());
        self.command(CtrlOp::SetParams, CtrlCmd::for_device(id), Some(buffer))?;
        Ok(())
    }

    /// Starts device `id`, served by process `pid`: returns once every tag
    /// is fetched and `/dev/ublkbN` exists.
    pub fn start(&mut self, id: u32, pid: u32) -> io::Result<()> {
        let cmd = CtrlCmd {
            data: u64::from(pid),
            ..CtrlCmd::for_device(id)
        };
        self.command(CtrlOp::StartDev, cmd, None)?;
        Ok(())
    }

    /// Stops device `id`: the block device goes (after the requests it
    /// holds), and every command of its server completes with ABORT.
    pub fn stop(&mut self, id: u32) -> io::Result<()> {
        self.command(CtrlOp::StopDev, CtrlCmd::for_device(id), None)?;
        Ok(())
    }

    /// Deletes device `id`; waits until nothing holds its character device.
    pub fn delete(&mut self, id: u32) -> io::Result<()> {
        self.command(CtrlOp::DelDev, CtrlCmd::for_device(id), None)?;
        Ok(())
    }
}
