//! strata: topology-aware collective communication for sharded training.
//!
//! Layers (dependencies point one way): `capi -> comm -> algo -> {transport, kernels,
//! topology, sim}`. Start at [`comm::Comm`]; see the README for the topology grammar,
//! the algorithms and the benchmark.

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
pub mod memory;
pub mod sim;
pub mod topology;
pub mod traffic;
pub mod transport;

pub use algo::Algo;
pub use comm::{group_end, group_start, Comm, CommConfig, Op, Request, Work};
pub use dtype::{DataType, Element, ReduceOp};
pub use error::{Error, Result};
pub use memory::Buffer;
pub use topology::Topology;
