//! `libstrata_nccl.so`: NCCL's whole API (every `nccl*` function NCCL 2.32.3's
//! `libnccl.so.2` exports, [`symbols`]) in front of the real library, so that a program
//! written for NCCL reaches strata unchanged, through `LD_PRELOAD=libstrata_nccl.so` or
//! the `LD_AUDIT` object `libstrata_nccl_audit.so` (docs/nccl.md).
//!
//! - Served here ([`symbols::SERVED`]): communicators, collectives, point-to-point,
//!   groups, reduce ops (PreMulSum included), memory and registration. On strata's CPU
//!   device ([`real::cpu_device`]: no real library, or `STRATA_NCCL_DEVICE=cpu`) strata
//!   runs every one of them on host memory; with the real library they go to it, but
//!   for the all-gathers, reduce-scatters and all-reduces that strata's algorithms run
//!   faster on a communicator strata joined ([`join`], [`route`]).
//! - Forwarded ([`symbols::FORWARDED`], [`forward`]): every other function, unchanged,
//!   through a trampoline that jumps to the real library's function of the same name
//!   (any signature, nothing touched).
//!
//! `unsafe` here: the C ABI's raw pointers, the forwarding trampolines and the loaded
//! library's function pointers, each with a SAFETY comment.

// NCCL's names (types, constants, functions) as its header spells them.
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]
// NCCL's signatures.
#![allow(clippy::too_many_arguments)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod abi;
pub mod collectives;
pub mod comm;
pub mod errors;
pub mod forward;
pub mod group;
pub mod init;
pub mod join;
pub mod memory;
pub mod passthrough;
pub mod real;
pub mod redop;
pub mod route;
pub mod scratch;
pub mod serve;
pub mod symbols;
pub mod version;

pub use version::ncclGetVersion;
