//! The persistent reservation state of one LU as bytes: what a gateway
//! group keeps in one RADOS object per RBD image (`iscsi_ceph`, `crates/ceph/src/pr.rs`),
//! so that every gateway reads and writes the same state.
//!
//! Format, version 1 or 2 (big-endian; `str` is a u16 length then that
//! many bytes of UTF-8):
//!
//! | field | bytes |
//! |---|---|
//! | magic `IRPR` | 4 |
//! | version (1, or 2 when the version-2 tail is not empty) | 1 |
//! | flags: bit 0 APTPL, others 0 | 1 |
//! | epoch: +1 on every committed change (the compare-and-set counter) | 8 |
//! | PRgeneration (SPC-4 §6.15.2) | 4 |
//! | gateway count (at most [`MAX_GATEWAYS`]), then each: RADOS instance id u64, client address `str` | 2 + ... |
//! | registration count (at most [`MAX_REGISTRATIONS`]), then each: reservation key u64, relative target port u16, initiator port `str`, TransportID (u16 length + bytes) | 2 + ... |
//! | reservation: 0, or 1 then type u8, holder's relative target port u16, holder's initiator port `str` | 1 or more |
//! | version 2 only: resets so far (u64); the ASCQ of ASC 29h the last one raised (0 with no reset); mode parameters (bit 0 WCE, bit 1 D_SENSE, bit 2 SWP, others 0); the SPC-2 RESERVE(6)/(10) holder: 0, or 1 then its relative target port u16 and initiator port `str` | 11 or more |
//!
//! Version 2 exists because SPC-2 reservations, resets and mode
//! parameters came to be shared after version 1 was in use: a record with
//! none of them (no SPC-2 reservation held, no reset yet, the default mode
//! parameters) is still written as version 1, so a
//! gateway that knows only version 1 keeps working beside a newer one
//! until either is used; it refuses a version 2 record (stale, never a
//! misread state). A version 2 record with an empty tail is refused: it
//! would re-encode as version 1.
//!
//! [`PrRecord::decode`] refuses anything [`PrRecord::encode`] would not
//! have written: another magic or version, unknown flags, lengths past the
//! end or over the limits, bytes after the end, invalid UTF-8, an
//! initiator port not lower-cased, a TransportID that does not name its
//! registration's initiator port, the same nexus registered twice, a
//! reservation type SPC-4 does not define, a single-holder reservation
//! whose holder is not registered, a reservation with no registration.
//! So a record that decodes re-encodes to the same bytes (the fuzz target
//! `pr_record` checks this), and a damaged object is refused cleanly
//! instead of becoming a reservation nobody holds.

use std::fmt;

use crate::nexus::{Nexus, NexusKey, parse_iscsi_transport_id};
use crate::pr_state::{PrState, PrType, Registration, Reservation};

pub use crate::pr_state::MAX_REGISTRATIONS;

/// Most gateways one record remembers for fencing; a new one pushes the
/// oldest out (it was restarted or is gone: its entry only served to fence
/// it).
pub const MAX_GATEWAYS: usize = 32;

const MAGIC: &[u8; 4] = b"IRPR";
const VERSION: u8 = 1;
/// Adds the tail of the table's last row.
const VERSION_2: u8 = 2;
/// The mode parameters' bits at power on (WCE set): what a version 1
/// record means.
pub(crate) const DEFAULT_MODE: u8 = 0x01;
const MODE_BITS: u8 = 0x07;
const FLAG_APTPL: u8 = 0x01;
/// Longest string field: an iSCSI name is at most 223 bytes (RFC 7143
/// §4.2.7.1) plus `,i,0x` and 12 hex digits; addresses are short.
const MAX_STR: usize = 512;
/// Longest TransportID: 4 header bytes and the padded name.
const MAX_TID: usize = MAX_STR + 8;

/// One gateway's RADOS client of an LU: who to blocklist to fence it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gateway {
    /// `rados_get_instance_id` (the id notify replies carry).
    pub gid: u64,
    /// One entity address of the client, as `rados_blocklist_add` takes it.
    pub addr: String,
}

/// The whole record: the reservation state, its epoch and the gateways.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrRecord {
    /// Compare-and-set counter, one more on each committed change.
    pub epoch: u64,
    /// Gateways whose clients use the LU (most recent last).
    pub gateways: Vec<Gateway>,
    pub(crate) pr: PrState,
    /// The I_T nexus holding an SPC-2 RESERVE(6)/(10) reservation.
    pub(crate) spc2: Option<NexusKey>,
    /// LOGICAL UNIT RESETs (and target resets) so far: a gateway that sees
    /// it grow raises the reset's unit attention for its own nexuses
    /// (SAM-5 §6.3.3: every I_T nexus of the LU, whichever gateway it goes
    /// through).
    pub resets: u64,
    /// The ASCQ (of ASC 29h) of the last reset's unit attention.
    pub reset_ascq: u8,
    /// The LU's mode parameters (one set for every nexus, SPC-4 §7.5), as
    /// `lu::ModeParams` bits.
    pub(crate) mode: u8,
}

/// Why bytes are not a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(&'static str);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "persistent reservation record: {}", self.0)
    }
}

impl std::error::Error for DecodeError {}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError("truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }
    fn blob(&mut self, max: usize) -> Result<&'a [u8], DecodeError> {
        let n = usize::from(self.u16()?);
        if n > max {
            return Err(DecodeError("a field longer than allowed"));
        }
        self.bytes(n)
    }
    fn str(&mut self) -> Result<&'a str, DecodeError> {
        std::str::from_utf8(self.blob(MAX_STR)?)
            .map_err(|_| DecodeError("a name that is not UTF-8"))
    }
    /// An initiator port: non-empty and lower-cased, as nexus keys are.
    fn port(&mut self) -> Result<&'a str, DecodeError> {
        let s = self.str()?;
        if s.is_empty() || s.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(DecodeError(
                "an initiator port that is empty or not lower-cased",
            ));
        }
        Ok(s)
    }
}

fn put_blob(v: &mut Vec<u8>, b: &[u8]) {
    // Lengths are bounded by decode and by the nexus's own limits; a
    // longer one is cut rather than written with a wrong length.
    let b = b
        .get(..b.len().min(usize::from(u16::MAX)))
        .unwrap_or_default();
    v.extend_from_slice(&(b.len() as u16).to_be_bytes());
    v.extend_from_slice(b);
}

impl Default for PrRecord {
    fn default() -> Self {
        Self::new(0, Vec::new(), PrState::default())
    }
}

impl PrRecord {
    /// The record of `pr` at `epoch`.
    pub(crate) fn new(epoch: u64, gateways: Vec<Gateway>, pr: PrState) -> Self {
        Self {
            epoch,
            gateways,
            pr,
            spc2: None,
            resets: 0,
            reset_ascq: 0,
            mode: DEFAULT_MODE,
        }
    }

    /// Whether an SPC-2 reservation is held.
    pub fn is_spc2_reserved(&self) -> bool {
        self.spc2.is_some()
    }

    /// Whether the record needs version 2 (see the module's table).
    fn has_tail(&self) -> bool {
        self.resets != 0 || self.spc2.is_some() || self.mode != DEFAULT_MODE
    }

    /// Number of registrations held.
    pub fn registration_count(&self) -> usize {
        self.pr.registrations.len()
    }

    /// Registers `nexus` with `res_key` as PERSISTENT RESERVE OUT REGISTER
    /// would (a new generation): what another gateway's REGISTER leaves in
    /// the record, for a tool or test that stands in for that gateway.
    pub fn register(&mut self, nexus: &crate::nexus::Nexus, res_key: u64) {
        self.pr.registrations.push(crate::pr_state::Registration {
            key: nexus.key().clone(),
            nexus: nexus.clone(),
            res_key,
        });
        self.pr.generation += 1;
    }

    /// Whether APTPL is set.
    pub fn aptpl(&self) -> bool {
        self.pr.aptpl
    }

    /// Whether a persistent reservation is held.
    pub fn is_reserved(&self) -> bool {
        self.pr.reservation.is_some()
    }

    /// The record as bytes (see the module's table).
    pub fn encode(&self) -> Vec<u8> {
        let pr = &self.pr;
        let mut v = Vec::with_capacity(64 + pr.registrations.len() * 96);
        v.extend_from_slice(MAGIC);
        v.push(if self.has_tail() { VERSION_2 } else { VERSION });
        v.push(if pr.aptpl { FLAG_APTPL } else { 0 });
        v.extend_from_slice(&self.epoch.to_be_bytes());
        v.extend_from_slice(&pr.generation.to_be_bytes());
        let gateways = self.gateways.len().min(MAX_GATEWAYS);
        v.extend_from_slice(&(gateways as u16).to_be_bytes());
        for g in self.gateways.iter().take(gateways) {
            v.extend_from_slice(&g.gid.to_be_bytes());
            put_blob(&mut v, g.addr.as_bytes());
        }
        v.extend_from_slice(&(pr.registrations.len() as u16).to_be_bytes());
        for r in &pr.registrations {
            v.extend_from_slice(&r.res_key.to_be_bytes());
            v.extend_from_slice(&r.key.target_port().to_be_bytes());
            put_blob(&mut v, r.key.initiator_port().as_bytes());
            put_blob(&mut v, &r.nexus.transport_id);
        }
        match &pr.reservation {
            None => v.push(0),
            Some(res) => {
                v.push(1);
                v.push(res.kind.code());
                v.extend_from_slice(&res.holder.target_port().to_be_bytes());
                put_blob(&mut v, res.holder.initiator_port().as_bytes());
            }
        }
        if self.has_tail() {
            v.extend_from_slice(&self.resets.to_be_bytes());
            v.push(self.reset_ascq);
            v.push(self.mode);
            match &self.spc2 {
                None => v.push(0),
                Some(holder) => {
                    v.push(1);
                    v.extend_from_slice(&holder.target_port().to_be_bytes());
                    put_blob(&mut v, holder.initiator_port().as_bytes());
                }
            }
        }
        v
    }

    /// Parses a record, refusing anything [`PrRecord::encode`] would not
    /// have written (see the module's list).
    pub fn decode(bytes: &[u8]) -> Result<PrRecord, DecodeError> {
        let mut r = Reader(bytes);
        if r.bytes(4)? != MAGIC {
            return Err(DecodeError("not a record (magic)"));
        }
        let version = r.u8()?;
        if version != VERSION && version != VERSION_2 {
            return Err(DecodeError("an unknown version"));
        }
        let flags = r.u8()?;
        if flags & !FLAG_APTPL != 0 {
            return Err(DecodeError("unknown flags"));
        }
        let epoch = r.u64()?;
        let generation = r.u32()?;
        let n = usize::from(r.u16()?);
        if n > MAX_GATEWAYS {
            return Err(DecodeError("too many gateways"));
        }
        let mut gateways = Vec::with_capacity(n);
        for _ in 0..n {
            let gid = r.u64()?;
            let addr = r.str()?.to_owned();
            gateways.push(Gateway { gid, addr });
        }
        let n = usize::from(r.u16()?);
        if n > MAX_REGISTRATIONS {
            return Err(DecodeError("too many registrations"));
        }
        let mut registrations: Vec<Registration> = Vec::with_capacity(n);
        for _ in 0..n {
            let res_key = r.u64()?;
            let target_port = r.u16()?;
            let port = r.port()?;
            let tid = r.blob(MAX_TID)?;
            match parse_iscsi_transport_id(tid) {
                Ok((named, len)) if named == port && len == tid.len() => {}
                _ => {
                    return Err(DecodeError(
                        "a TransportID that does not name its initiator port",
                    ));
                }
            }
            let nexus = Nexus::new(port.to_owned(), target_port, tid.to_vec());
            let key = nexus.key().clone();
            if registrations.iter().any(|x| x.key == key) {
                return Err(DecodeError("a nexus registered twice"));
            }
            registrations.push(Registration {
                nexus,
                key,
                res_key,
            });
        }
        let reservation = match r.u8()? {
            0 => None,
            1 => {
                let kind =
                    PrType::from_code(r.u8()?).ok_or(DecodeError("an unknown reservation type"))?;
                let target_port = r.u16()?;
                let holder = NexusKey::new(r.port()?, target_port);
                let registered = registrations.iter().any(|x| x.key == holder);
                if registrations.is_empty() || (!kind.all_registrants() && !registered) {
                    return Err(DecodeError(
                        "a reservation its holder is not registered for",
                    ));
                }
                Some(Reservation { holder, kind })
            }
            _ => return Err(DecodeError("a reservation flag other than 0 or 1")),
        };
        let (mut resets, mut reset_ascq, mut mode, mut spc2) = (0, 0, DEFAULT_MODE, None);
        if version == VERSION_2 {
            resets = r.u64()?;
            reset_ascq = r.u8()?;
            if resets == 0 && reset_ascq != 0 {
                return Err(DecodeError("a reset's ASCQ with no reset"));
            }
            mode = r.u8()?;
            if mode & !MODE_BITS != 0 {
                return Err(DecodeError("unknown mode parameter bits"));
            }
            spc2 = match r.u8()? {
                0 => None,
                1 => {
                    let target_port = r.u16()?;
                    Some(NexusKey::new(r.port()?, target_port))
                }
                _ => return Err(DecodeError("an SPC-2 holder flag other than 0 or 1")),
            };
            if resets == 0 && spc2.is_none() && mode == DEFAULT_MODE {
                return Err(DecodeError("a version 2 record with nothing of version 2"));
            }
        }
        if !r.0.is_empty() {
            return Err(DecodeError("bytes after the end"));
        }
        Ok(PrRecord {
            epoch,
            gateways,
            pr: PrState {
                generation,
                registrations,
                reservation,
                aptpl: flags & FLAG_APTPL != 0,
            },
            spc2,
            resets,
            reset_ascq,
            mode,
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn record(regs: &[(u8, u16, u64)], res: Option<(usize, u8)>, aptpl: bool) -> PrRecord {
        let mut pr = PrState {
            aptpl,
            generation: 7,
            ..PrState::default()
        };
        for &(who, port, key) in regs {
            let nexus = Nexus::iscsi(
                &format!("iqn.2026-11.rs.iscsi:i{who}"),
                u64::from(who),
                port,
            );
            if pr.registrations.iter().any(|r| &r.key == nexus.key()) {
                continue;
            }
            pr.registrations.push(Registration {
                key: nexus.key().clone(),
                nexus,
                res_key: key,
            });
        }
        if let Some((i, code)) = res
            && let Some(r) = pr.registrations.get(i % pr.registrations.len().max(1))
        {
            pr.reservation = Some(Reservation {
                holder: r.key.clone(),
                kind: PrType::from_code(code).unwrap(),
            });
        }
        PrRecord::new(
            42,
            vec![Gateway {
                gid: 4100,
                addr: "127.0.0.1:0/3344".into(),
            }],
            pr,
        )
    }

    #[test]
    fn refuses_damaged_records() {
        let good = record(&[(1, 1, 0xAB), (2, 2, 0xCD)], Some((0, 5)), true).encode();
        assert!(PrRecord::decode(&good).is_ok());
        // Every truncation, and every byte after the end.
        for cut in 0..good.len() {
            assert!(PrRecord::decode(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = good.clone();
        long.push(0);
        assert!(PrRecord::decode(&long).is_err());
        let mut bad = good.clone();
        bad[0] = b'X';
        assert_eq!(
            PrRecord::decode(&bad),
            Err(DecodeError("not a record (magic)"))
        );
        let mut bad = good.clone();
        bad[4] = 3;
        assert_eq!(
            PrRecord::decode(&bad),
            Err(DecodeError("an unknown version"))
        );
        let mut bad = good.clone();
        bad[5] = 0x81;
        assert_eq!(PrRecord::decode(&bad), Err(DecodeError("unknown flags")));
        // An unknown type (the type byte follows the reservation flag).
        let at = good.len() - (1 + 2 + 2 + "iqn.2026-11.rs.iscsi:i1,i,0x000000000001".len());
        assert_eq!(good[at], 5);
        let mut bad = good.clone();
        bad[at] = 2;
        assert_eq!(
            PrRecord::decode(&bad),
            Err(DecodeError("an unknown reservation type"))
        );
        // An upper-cased initiator port.
        let mut bad = good.clone();
        let last = bad.len() - 1;
        bad[last] = b'A';
        assert!(PrRecord::decode(&bad).is_err());
        // A holder that is not registered.
        let mut rec = record(&[(1, 1, 0xAB)], Some((0, 1)), false);
        rec.pr.reservation.as_mut().unwrap().holder = NexusKey::new("iqn.x,i,0x000000000009", 1);
        assert!(PrRecord::decode(&rec.encode()).is_err());
        // A registration whose TransportID names another port.
        let mut rec = record(&[(1, 1, 0xAB)], None, false);
        rec.pr.registrations[0].nexus.transport_id =
            crate::nexus::iscsi_transport_id("iqn.y,i,0x000000000001");
        assert!(PrRecord::decode(&rec.encode()).is_err());
    }

    /// SPC-2 reservations and resets make a version 2 record; without them
    /// it stays version 1, byte for byte what a version-1-only gateway
    /// wrote and reads.
    #[test]
    fn version_2_only_when_needed() {
        let mut rec = record(&[(1, 1, 0xAB)], Some((0, 5)), false);
        let v1 = rec.encode();
        assert_eq!(v1[4], 1);
        rec.spc2 = Some(NexusKey::new("iqn.x,i,0x000000000009", 2));
        let v2 = rec.encode();
        assert_eq!(v2[4], 2);
        // The same bytes but the version, then the tail.
        let mut head = v1.clone();
        head[4] = 2;
        assert_eq!(&v2[..v1.len()], &head[..]);
        assert_eq!(PrRecord::decode(&v2), Ok(rec.clone()));
        // Every truncation of the tail is refused.
        for cut in v1.len()..v2.len() {
            assert!(PrRecord::decode(&v2[..cut]).is_err(), "cut at {cut}");
        }
        // A version 2 record whose tail says nothing would re-encode as
        // version 1: refused.
        let mut empty = v1.clone();
        empty[4] = 2;
        empty.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, DEFAULT_MODE, 0]);
        assert_eq!(
            PrRecord::decode(&empty),
            Err(DecodeError("a version 2 record with nothing of version 2"))
        );
        // A bad holder flag.
        let mut bad = v1.clone();
        bad[4] = 2;
        bad.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 1, 3, 1, 2]);
        assert!(PrRecord::decode(&bad).is_err());
        // Unknown mode bits; an ASCQ with no reset.
        let mut bad = v1.clone();
        bad[4] = 2;
        bad.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 1, 3, 0x09, 0]);
        assert!(PrRecord::decode(&bad).is_err());
        let mut bad = v1.clone();
        bad[4] = 2;
        bad.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 3, 0x05, 0]);
        assert!(PrRecord::decode(&bad).is_err());
        // Mode parameters alone make version 2.
        rec.spc2 = None;
        rec.mode = 0x04;
        assert_eq!(rec.encode()[4], 2);
        assert_eq!(PrRecord::decode(&rec.encode()), Ok(rec.clone()));
        rec.mode = DEFAULT_MODE;
        // Resets alone make version 2 too.
        rec.resets = 3;
        rec.reset_ascq = 3;
        assert_eq!(PrRecord::decode(&rec.encode()), Ok(rec));
    }

    /// The fuzz target's seed is a record (so the fuzzer starts from one).
    #[test]
    fn the_fuzz_seed_is_a_record() {
        let seed = include_bytes!("../../../fuzz/seeds/pr_record/reserved-aptpl.bin");
        let rec = PrRecord::decode(seed).unwrap();
        assert!(rec.aptpl() && rec.is_reserved());
        assert_eq!((rec.epoch, rec.registration_count()), (3, 1));
        assert_eq!(rec.encode(), seed);
        let seed = include_bytes!("../../../fuzz/seeds/pr_record/spc2-reset.bin");
        let rec = PrRecord::decode(seed).unwrap();
        assert!(rec.is_spc2_reserved() && rec.resets == 2);
        assert_eq!(rec.encode(), seed);
    }

    proptest! {
        #[test]
        fn round_trips(
            regs in proptest::collection::vec((any::<u8>(), 1u16..4, any::<u64>()), 0..40),
            res in proptest::option::of((any::<usize>(), prop::sample::select(vec![1u8, 3, 5, 6, 7, 8]))),
            aptpl in any::<bool>(),
            spc2 in proptest::option::of((any::<u8>(), 1u16..4)),
            resets in prop::sample::select(vec![0u64, 1, u64::MAX]),
            ascq in 0u8..4,
            mode in 0u8..8,
        ) {
            let mut rec = record(&regs, res, aptpl);
            rec.spc2 = spc2.map(|(who, port)| {
                Nexus::iscsi(&format!("iqn.2026-11.rs.iscsi:i{who}"), u64::from(who), port)
                    .key()
                    .clone()
            });
            rec.resets = resets;
            rec.reset_ascq = if resets == 0 { 0 } else { ascq };
            rec.mode = mode;
            let bytes = rec.encode();
            let back = PrRecord::decode(&bytes).unwrap();
            prop_assert_eq!(&back, &rec);
            prop_assert_eq!(back.encode(), bytes);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(rec) = PrRecord::decode(&bytes) {
                prop_assert_eq!(rec.encode(), bytes);
            }
        }
    }
}
