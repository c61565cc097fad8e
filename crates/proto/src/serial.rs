//! Sequence numbers: RFC 1982 serial number arithmetic (SERIAL_BITS = 32),
//! which RFC 7143 section 4.2.2.1 prescribes for CmdSN, StatSN, DataSN and
//! R2TSN, and the command window check of section 4.2.2.1.
//!
//! Each kind of sequence number is its own type ([`CmdSn`], [`StatSn`],
//! [`DataSn`], [`R2tSn`]) over one generic [`Serial`], so a StatSN can never
//! be compared with a CmdSN by mistake.
//!
//! RFC 1982 leaves the comparison of two numbers exactly 2^31 apart
//! undefined: [`Serial::serial_cmp`] returns `None` for it, and
//! [`Serial::lt`] and friends return `false`.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;

/// Half the serial number space, 2^(SERIAL_BITS - 1) (RFC 1982 section 3.2).
const HALF: u32 = 1 << 31;

/// Marker for command sequence numbers (CmdSN, ExpCmdSN, MaxCmdSN, RefCmdSN).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmdSnKind {}
/// Marker for status sequence numbers (StatSN, ExpStatSN).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StatSnKind {}
/// Marker for data sequence numbers (DataSN, ExpDataSN).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataSnKind {}
/// Marker for R2T sequence numbers (R2TSN).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum R2tSnKind {}

/// A 32-bit serial number of kind `K` (RFC 1982 with SERIAL_BITS = 32).
///
/// `Eq` is plain equality of the values (RFC 1982 section 3.2 defines
/// equality the same way); ordering is only partial, hence no `Ord`.
pub struct Serial<K>(u32, PhantomData<fn() -> K>);

/// CmdSN, ExpCmdSN, MaxCmdSN and RefCmdSN (RFC 7143 section 4.2.2.1).
pub type CmdSn = Serial<CmdSnKind>;
/// StatSN and ExpStatSN (RFC 7143 section 4.2.2.2).
pub type StatSn = Serial<StatSnKind>;
/// DataSN and ExpDataSN (RFC 7143 sections 11.7.5, 11.4.8).
pub type DataSn = Serial<DataSnKind>;
/// R2TSN (RFC 7143 section 11.8.2).
pub type R2tSn = Serial<R2tSnKind>;

impl<K> Serial<K> {
    /// The serial number with wire value `value`.
    pub const fn new(value: u32) -> Self {
        Serial(value, PhantomData)
    }

    /// The wire value.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^32 (RFC 1982 section 3.1). RFC 1982 only defines
    /// additions of at most 2^31 - 1; larger `n` still wraps.
    #[must_use]
    pub const fn wrapping_add(self, n: u32) -> Self {
        Serial::new(self.0.wrapping_add(n))
    }

    /// The next serial number, `self + 1`.
    #[must_use]
    pub const fn next(self) -> Self {
        self.wrapping_add(1)
    }

    /// The forward distance from `self` to `later`, modulo 2^32: how many
    /// increments take `self` to `later`.
    pub const fn distance_to(self, later: Self) -> u32 {
        later.0.wrapping_sub(self.0)
    }

    /// RFC 1982 section 3.2 comparison: `Some(Less)` when `self < other`,
    /// `None` when the two are exactly 2^31 apart (undefined).
    pub fn serial_cmp(self, other: Self) -> Option<Ordering> {
        let forward = other.0.wrapping_sub(self.0);
        match forward {
            0 => Some(Ordering::Equal),
            HALF => None,
            f if f < HALF => Some(Ordering::Less),
            _ => Some(Ordering::Greater),
        }
    }

    /// `self < other` per RFC 1982; `false` when undefined.
    pub fn lt(self, other: Self) -> bool {
        self.serial_cmp(other) == Some(Ordering::Less)
    }

    /// `self > other` per RFC 1982; `false` when undefined.
    pub fn gt(self, other: Self) -> bool {
        self.serial_cmp(other) == Some(Ordering::Greater)
    }

    /// `self <= other` per RFC 1982; `false` when undefined.
    pub fn le(self, other: Self) -> bool {
        matches!(
            self.serial_cmp(other),
            Some(Ordering::Less | Ordering::Equal)
        )
    }

    /// `self >= other` per RFC 1982; `false` when undefined.
    pub fn ge(self, other: Self) -> bool {
        matches!(
            self.serial_cmp(other),
            Some(Ordering::Greater | Ordering::Equal)
        )
    }
}

/// Whether `sn` lies in the window `low..=high`, both inclusive, in serial
/// arithmetic: `low <= sn <= high` per RFC 1982.
///
/// For the command window (RFC 7143 section 4.2.2.1) pass `low = ExpCmdSN`
/// and `high = MaxCmdSN`: the window holds `MaxCmdSN - ExpCmdSN + 1`
/// numbers, and `MaxCmdSN == ExpCmdSN - 1` means the window is closed (no
/// number is in it). A window whose `high` is not at or after `low` in
/// serial arithmetic (more than 2^31 numbers, or "backwards"), and any
/// comparison RFC 1982 leaves undefined, yields `false`.
pub fn in_window<K>(sn: Serial<K>, low: Serial<K>, high: Serial<K>) -> bool {
    // Closed window: high == low - 1.
    if high.next() == low {
        return false;
    }
    low.le(sn) && sn.le(high) && low.le(high)
}

/// The number of serial numbers in the window `low..=high`
/// (`high - low + 1`), 0 when the window is closed (`high == low - 1`), and
/// `None` when `high` is not at or after `low` in serial arithmetic (a
/// window the peer should never announce, RFC 7143 section 4.2.2.1).
pub fn window_size<K>(low: Serial<K>, high: Serial<K>) -> Option<u32> {
    if high.next() == low {
        return Some(0);
    }
    if low.le(high) {
        Some(low.distance_to(high).wrapping_add(1))
    } else {
        None
    }
}

impl<K> Clone for Serial<K> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K> Copy for Serial<K> {}
impl<K> PartialEq for Serial<K> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl<K> Eq for Serial<K> {}
impl<K> Hash for Serial<K> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}
impl<K> Default for Serial<K> {
    fn default() -> Self {
        Serial::new(0)
    }
}
impl<K> fmt::Debug for Serial<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
impl<K> fmt::Display for Serial<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
impl<K> From<u32> for Serial<K> {
    fn from(value: u32) -> Self {
        Serial::new(value)
    }
}
impl<K> From<Serial<K>> for u32 {
    fn from(sn: Serial<K>) -> u32 {
        sn.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sn(v: u32) -> CmdSn {
        CmdSn::new(v)
    }

    #[test]
    fn rfc1982_basics() {
        assert!(sn(1).lt(sn(2)));
        assert!(sn(u32::MAX).lt(sn(0)), "wraps: 2^32-1 < 0");
        assert!(sn(0).gt(sn(u32::MAX)));
        assert!(sn(5).le(sn(5)) && sn(5).ge(sn(5)));
        assert_eq!(sn(0).serial_cmp(sn(HALF)), None);
        assert!(!sn(0).lt(sn(HALF)) && !sn(0).gt(sn(HALF)));
        assert!(!sn(0).le(sn(HALF)) && !sn(0).ge(sn(HALF)));
        assert!(sn(0).lt(sn(HALF - 1)));
        assert!(sn(0).gt(sn(HALF + 1)));
        assert_eq!(sn(u32::MAX).wrapping_add(2), sn(1));
    }

    #[test]
    fn command_window() {
        // ExpCmdSN = 10, MaxCmdSN = 12: 10, 11, 12 are in.
        assert!(!in_window(sn(9), sn(10), sn(12)));
        assert!(in_window(sn(10), sn(10), sn(12)));
        assert!(in_window(sn(12), sn(10), sn(12)));
        assert!(!in_window(sn(13), sn(10), sn(12)));
        assert_eq!(window_size(sn(10), sn(12)), Some(3));
        // Closed: MaxCmdSN = ExpCmdSN - 1.
        assert!(!in_window(sn(10), sn(10), sn(9)));
        assert!(!in_window(sn(9), sn(10), sn(9)));
        assert_eq!(window_size(sn(10), sn(9)), Some(0));
        assert_eq!(window_size(sn(0), sn(u32::MAX)), Some(0));
        // Across the wrap.
        assert!(in_window(sn(1), sn(u32::MAX - 1), sn(3)));
        assert!(in_window(sn(u32::MAX), sn(u32::MAX - 1), sn(3)));
        assert!(!in_window(sn(4), sn(u32::MAX - 1), sn(3)));
        assert_eq!(window_size(sn(u32::MAX - 1), sn(3)), Some(6));
        // Backwards window.
        assert_eq!(window_size(sn(10), sn(5)), None);
        assert!(!in_window(sn(7), sn(10), sn(5)));
    }

    proptest! {
        #[test]
        fn cmp_is_antisymmetric(a: u32, b: u32) {
            let (a, b) = (sn(a), sn(b));
            prop_assert_eq!(a.serial_cmp(b), b.serial_cmp(a).map(Ordering::reverse));
            prop_assert_eq!(a.lt(b), b.gt(a));
            prop_assert_eq!(a.le(b), b.ge(a));
        }

        #[test]
        fn adding_less_than_half_is_greater(a: u32, n in 1u32..HALF) {
            let a = sn(a);
            prop_assert!(a.wrapping_add(n).gt(a));
            prop_assert!(a.lt(a.wrapping_add(n)));
            prop_assert_eq!(a.distance_to(a.wrapping_add(n)), n);
        }

        #[test]
        fn window_membership_matches_offsets(low: u32, size in 0u32..1000, off in 0u32..2000) {
            let low = sn(low);
            let high = low.wrapping_add(size).wrapping_add(u32::MAX); // low + size - 1
            let x = low.wrapping_add(off);
            prop_assert_eq!(in_window(x, low, high), off < size);
            prop_assert_eq!(window_size(low, high), Some(size));
        }
    }
}
