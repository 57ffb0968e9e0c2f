//! strata's command-line tools: `strata-perf` (the nccl-tests-style benchmark),
//! `strata-sim` (the modeled cost of a collective) and `strata-gpu-check` (the GPU
//! kernels against the CPU reference), with what they share: the command-line value
//! parsers ([`cli`]) and the transport-independent self test ([`selftest`]) that the
//! tests and `examples/mpi_check.rs` run on every transport, and the end-to-end test of
//! collective mismatch detection ([`mismatch`]), run the same way; the examples run
//! under mpirun end through [`mpirun`]. Report lines go through [`outln!`] ([`out`]).
#![forbid(unsafe_code)]

pub mod cli;
pub mod mismatch;
pub mod mpirun;
pub mod out;
pub mod selftest;
