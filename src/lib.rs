//! strata: topology-aware collective communication for sharded training.
//!
//! Layers (dependencies point one way, `tests/layers.rs` keeps them so):
//!
//! ```text
//! capi -> check -> comm (front: check, select, dispatch; bootstrap) -> sim -> algo
//!      -> runtime (streams, groups, requests, sub-communicators, native enqueue)
//!      -> bufops -> transport -> memory -> device -> kernels_gpu -> kernels -> traffic
//! leaves used by all: topology, dtype, kinds, config, log, units, error
//! ```
//!
//! Start at [`comm::Comm`]; see docs/architecture.md for the layout and the README for
//! the rest.

pub mod algo;
pub mod bufops;
pub mod capi;
pub mod check;
pub mod comm;
pub mod config;
pub mod device;
pub mod dtype;
pub mod error;
pub mod kernels;
pub mod kernels_gpu;
pub mod kinds;
pub mod log;
pub mod memory;
pub mod runtime;
pub mod sim;
pub mod topology;
pub mod traffic;
pub mod transport;
pub mod units;

pub use algo::Algo;
pub use comm::{group_end, group_start, Comm, CommConfig, Op, Request, Work};
pub use dtype::{DataType, Element, ReduceOp};
pub use error::{Error, Result};
pub use memory::Buffer;
pub use topology::Topology;
