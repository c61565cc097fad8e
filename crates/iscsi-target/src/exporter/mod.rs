//! The metrics endpoint (`iscsi target --metrics ADDR:PORT`): what
//! `crate::metrics` counted, summed at scrape time and served in the
//! OpenMetrics text format by the official `prometheus-client` crate.
//!
//! - `collect`: the `Collector` that encodes it all at scrape time.
//! - [`http`]: the endpoint (GET /metrics), started from a
//!   [`ServerHandle`](crate::server::ServerHandle).

pub(crate) mod collect;
pub mod http;
