//! Login (RFC 7143 sections 6.3, 10.12, 10.13 and 12): the authentication
//! exchange.
//!
//! - [`chap`]: CHAP one-way and mutual, MD5/SHA-1/SHA-256/SHA3-256.

pub mod chap;
