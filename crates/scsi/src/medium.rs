//! What a LUN's options make of its logical unit ([`LuOptions`]): a
//! read-only medium, a removable one (with the load/eject and
//! prevent/allow state of SBC-3 §5.11 and §5.25), and a physical block
//! larger than the logical one (512e).
//!
//! The options are fixed when the LU is made (the store reports them,
//! [`crate::backstore::Backstore::lu_options`]); the removable medium's state
//! ([`Medium`]) lives with the rest of the LU's state in `lu.rs`.

use std::collections::HashSet;

use crate::nexus::NexusKey;
use iscsi_sense::Sense;

/// The options a LUN specification gives its logical unit
/// (`ram:64M,readonly,removable,physical-block=4096`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LuOptions {
    /// Every command that would change the medium ends in DATA PROTECT /
    /// WRITE PROTECTED, and MODE SENSE reports WP: a golden image or a
    /// medium shared read-only.
    pub read_only: bool,
    /// INQUIRY reports RMB: START STOP UNIT with LOEJ ejects and loads the
    /// medium, PREVENT ALLOW MEDIUM REMOVAL is honoured per I_T nexus.
    /// The data stays across an eject (it is the same medium loaded
    /// again).
    pub removable: bool,
    /// The physical block size in bytes when larger than the logical one
    /// (a power-of-two multiple of it: 4096 over 512 is "512e"), reported
    /// in READ CAPACITY(16) and the Block Limits page so that initiators
    /// align their I/O. `None`: physical and logical blocks are one size.
    pub physical_block_size: Option<u32>,
}

impl LuOptions {
    /// No option: a writable, fixed medium whose physical and logical
    /// blocks are one size.
    pub const DEFAULT: Self = Self {
        read_only: false,
        removable: false,
        physical_block_size: None,
    };

    /// Whether `physical_block_size` suits logical blocks of `block_size`
    /// bytes: a power-of-two multiple of it (1, 2, 4... logical blocks per
    /// physical block). The error says what is wrong.
    pub fn check(&self, block_size: u32) -> Result<(), String> {
        match self.physical_block_size {
            Some(p)
                if p < block_size
                    || !p.is_multiple_of(block_size.max(1))
                    || !(p / block_size.max(1)).is_power_of_two() =>
            {
                Err(format!(
                    "physical block size {p} is not a power-of-two multiple of the \
                     logical block size {block_size}"
                ))
            }
            _ => Ok(()),
        }
    }

    /// LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT (READ CAPACITY(16),
    /// SBC-3 §5.16.2) for logical blocks of `block_size` bytes: 3 for 4096
    /// over 512; 0 without a physical block size or with one that does not
    /// [`check`](LuOptions::check).
    pub fn lbppbe(&self, block_size: u32) -> u8 {
        match self.physical_block_size {
            Some(p) if self.check(block_size).is_ok() => {
                u8::try_from((p / block_size.max(1)).trailing_zeros()).unwrap_or(0) & 0x0F
            }
            _ => 0,
        }
    }
}

/// A removable medium's state (SBC-3 §5.11, §5.25), kept with the LU's.
#[derive(Debug, Default)]
pub(crate) struct Medium {
    /// Ejected by START STOP UNIT (LOEJ 1, START 0) and not loaded again:
    /// commands that access the medium end in NOT READY / MEDIUM NOT
    /// PRESENT.
    pub ejected: bool,
    /// The I_T nexuses that sent PREVENT ALLOW MEDIUM REMOVAL with
    /// PREVENT 01b and have not allowed it since: removal stays prevented
    /// while any does (SBC-3 §5.11). Cleared for a nexus when it is lost
    /// and for all by a reset.
    pub prevented: HashSet<NexusKey>,
}

/// What START STOP UNIT asks of a removable medium.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoadEject {
    /// LOEJ 1, START 0.
    Eject,
    /// LOEJ 1, START 1.
    Load,
}

impl Medium {
    /// Applies `action`. While some nexus prevents removal, the medium
    /// neither leaves nor arrives: a load or an eject fails with ILLEGAL
    /// REQUEST / MEDIUM REMOVAL PREVENTED (SBC-3 §5.25; libiscsi's
    /// PreventAllow.Eject checks both). Says whether a medium was loaded
    /// that was not there (the caller then raises NOT READY TO READY
    /// CHANGE for the other nexuses).
    pub fn load_eject(&mut self, action: LoadEject) -> Result<bool, Sense> {
        if !self.prevented.is_empty() {
            return Err(Sense::MEDIUM_REMOVAL_PREVENTED);
        }
        match action {
            LoadEject::Eject => {
                self.ejected = true;
                Ok(false)
            }
            LoadEject::Load => Ok(std::mem::replace(&mut self.ejected, false)),
        }
    }

    /// PREVENT ALLOW MEDIUM REMOVAL from `nexus`.
    pub fn prevent(&mut self, nexus: &NexusKey, prevent: bool) {
        if prevent {
            self.prevented.insert(nexus.clone());
        } else {
            self.prevented.remove(nexus);
        }
    }
}

/// Whether `op` runs with no medium present: the commands that describe
/// the LU or its state rather than its medium (SPC-4 and SBC-3 let these
/// through; everything else, TEST UNIT READY included, reports MEDIUM NOT
/// PRESENT).
pub(crate) fn runs_without_medium(op: u8) -> bool {
    use crate::cdb::opcode::*;
    matches!(
        op,
        INQUIRY
            | REPORT_LUNS
            | REQUEST_SENSE
            | MODE_SENSE_6
            | MODE_SENSE_10
            | MODE_SELECT_6
            | MODE_SELECT_10
            | RESERVE_6
            | RESERVE_10
            | RELEASE_6
            | RELEASE_10
            | PERSISTENT_RESERVE_IN
            | PERSISTENT_RESERVE_OUT
            | MAINTENANCE_IN
            | START_STOP_UNIT
            | PREVENT_ALLOW_MEDIUM_REMOVAL
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn physical_blocks_are_power_of_two_multiples() {
        let with = |p| LuOptions {
            physical_block_size: Some(p),
            ..LuOptions::DEFAULT
        };
        assert_eq!(with(4096).lbppbe(512), 3);
        assert_eq!(with(4096).lbppbe(4096), 0);
        assert_eq!(with(1024).lbppbe(512), 1);
        assert_eq!(LuOptions::DEFAULT.lbppbe(512), 0);
        assert!(with(4096).check(512).is_ok());
        for (p, l) in [(1536, 512), (512, 4096), (3072, 512), (0, 512)] {
            let e = with(p).check(l).unwrap_err();
            assert!(e.contains("power-of-two multiple"), "{e}");
            assert_eq!(with(p).lbppbe(l), 0);
        }
    }

    #[test]
    fn an_eject_waits_for_every_prevent_to_go() {
        let a = crate::nexus::Nexus::iscsi("iqn.a", 1, 1).key().clone();
        let b = crate::nexus::Nexus::iscsi("iqn.b", 1, 1).key().clone();
        let mut m = Medium::default();
        m.prevent(&a, true);
        m.prevent(&b, true);
        m.prevent(&a, false);
        assert_eq!(
            m.load_eject(LoadEject::Eject),
            Err(Sense::MEDIUM_REMOVAL_PREVENTED)
        );
        assert!(!m.ejected);
        m.prevent(&b, false);
        assert_eq!(m.load_eject(LoadEject::Eject), Ok(false));
        assert!(m.ejected);
        m.prevent(&a, true);
        assert_eq!(
            m.load_eject(LoadEject::Load),
            Err(Sense::MEDIUM_REMOVAL_PREVENTED)
        );
        m.prevent(&a, false);
        assert_eq!(m.load_eject(LoadEject::Load), Ok(true));
        assert_eq!(m.load_eject(LoadEject::Load), Ok(false));
    }
}
