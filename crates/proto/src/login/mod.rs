//! Login (RFC 7143 sections 6.3, 10.12, 10.13, 11.12, 11.13 and 12): the
//! state machines both ends run from the first Login Request until full
//! feature phase, and the authentication exchange.
//!
//! - [`target`]: the target's side, with [`target::LoginPolicy`] for the
//!   driver's decisions (which targets exist, ACLs, session placement).
//! - [`initiator`]: the initiator's side.
//! - [`chap`]: CHAP one-way and mutual, MD5/SHA-1/SHA-256/SHA3-256.
//! - [`refusal`]: why the target refused a login, in words beside the
//!   status on the wire.

pub mod chap;
pub mod initiator;
pub mod refusal;
pub mod target;
