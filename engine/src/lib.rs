//! strata-engine: the sharded-training engine built on strata's safe Rust API.
//!
//! This crate is a placeholder member of the workspace until the engine issue lands; it
//! re-exports the communicator so dependants can already name it.

pub use strata::comm::Comm;
