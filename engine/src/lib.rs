//! strata-engine: every paper's sharding strategy (ZeRO-1/2/3, MiCS, ZeRO++, PaRO, AMSP,
//! Frontier) in one engine, a planner over all of them, and real training on strata's collectives (safe Rust API only, never the C ABI).
//!
//! - [`config`]: the configuration space (AMSP §IV-B generalized) and the presets
//!   (`zero1`, `zero2`, `zero3`, `mics:K`, `zeropp`, `paro-*`, `frontier-topo`, `amsp:`);
//! - [`compute`]: the trait the engine drives unit by unit;
//! - [`model`], [`data`]: a candle decoder-only transformer LM and its byte-level corpus;
//! - [`planner`]: memory and communication models and the ranked search (AMSP §IV-C/D, §V-B).

#![forbid(unsafe_code)]

pub mod account;
pub mod checkpoint;
pub mod compute;
pub mod config;
pub mod data;
pub mod error;
pub mod mesh;
pub mod model;
pub mod optim;
pub mod planner;
pub mod runtime;
pub mod train;

pub use compute::{Batch, UnitModel};
pub use config::{Factor, GradSync, Mesh, PhaseAlgos, Strategy};
pub use error::{Error, Result};
pub use runtime::{Engine, EngineConfig, Precision, Recovery, StepReport};
