//! The persistent reservation state of one LU ([`PrState`]: registrations
//! and the reservation) and its types: data that the LU holds, the shared
//! record (`pr_record`) encodes and `pr` changes, kept apart from both so
//! that the LU's state can hold it without importing the commands.

use crate::nexus::{Nexus, NexusKey};

/// Most registrations one LU holds; more is INSUFFICIENT REGISTRATION
/// RESOURCES (SPC-4 §5.12.7).
pub const MAX_REGISTRATIONS: usize = 256;

/// Persistent reservation types (SPC-4 Table 170).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrType {
    /// 1h: Write Exclusive.
    WriteExclusive = 1,
    /// 3h: Exclusive Access.
    ExclusiveAccess = 3,
    /// 5h: Write Exclusive - Registrants Only.
    WriteExclusiveRegistrantsOnly = 5,
    /// 6h: Exclusive Access - Registrants Only.
    ExclusiveAccessRegistrantsOnly = 6,
    /// 7h: Write Exclusive - All Registrants.
    WriteExclusiveAllRegistrants = 7,
    /// 8h: Exclusive Access - All Registrants.
    ExclusiveAccessAllRegistrants = 8,
}

impl PrType {
    /// The type from the TYPE field; `None` for reserved values.
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => Self::WriteExclusive,
            3 => Self::ExclusiveAccess,
            5 => Self::WriteExclusiveRegistrantsOnly,
            6 => Self::ExclusiveAccessRegistrantsOnly,
            7 => Self::WriteExclusiveAllRegistrants,
            8 => Self::ExclusiveAccessAllRegistrants,
            _ => return None,
        })
    }

    /// The TYPE field value.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// Whether every registrant is a reservation holder (SPC-4 §5.12.9).
    pub fn all_registrants(self) -> bool {
        matches!(
            self,
            Self::WriteExclusiveAllRegistrants | Self::ExclusiveAccessAllRegistrants
        )
    }

    /// Whether registrants that do not hold the reservation get access
    /// (the Registrants Only and All Registrants types).
    pub(crate) fn registrants_have_access(self) -> bool {
        !matches!(self, Self::WriteExclusive | Self::ExclusiveAccess)
    }

    /// Whether the type blocks reads too (the Exclusive Access types).
    pub(crate) fn exclusive_access(self) -> bool {
        matches!(
            self,
            Self::ExclusiveAccess
                | Self::ExclusiveAccessRegistrantsOnly
                | Self::ExclusiveAccessAllRegistrants
        )
    }
}

/// One registration: an I_T nexus and its reservation key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Registration {
    pub nexus: Nexus,
    pub key: NexusKey,
    pub res_key: u64,
}

/// The persistent reservation, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reservation {
    /// The holder (for the All Registrants types: the nexus that reserved;
    /// every registrant holds it).
    pub holder: NexusKey,
    pub kind: PrType,
}

/// Registrations and the reservation of one LU.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct PrState {
    pub generation: u32,
    pub registrations: Vec<Registration>,
    pub reservation: Option<Reservation>,
    /// APTPL as the last REGISTER (or REGISTER AND MOVE) set it; only ever
    /// set where the LU offers it (PTPL_C=1).
    pub aptpl: bool,
}

impl PrState {
    pub(crate) fn registration(&self, key: &NexusKey) -> Option<&Registration> {
        self.registrations.iter().find(|r| &r.key == key)
    }

    pub(crate) fn bump(&mut self) {
        self.generation = self.generation.wrapping_add(1);
    }

    /// Whether `key` holds the reservation.
    pub fn is_holder(&self, key: &NexusKey) -> bool {
        match &self.reservation {
            Some(r) if r.kind.all_registrants() => self.registration(key).is_some(),
            Some(r) => &r.holder == key,
            None => false,
        }
    }

    pub(crate) fn registered_keys(&self) -> Vec<NexusKey> {
        self.registrations.iter().map(|r| r.key.clone()).collect()
    }
}
