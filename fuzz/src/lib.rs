//! Fuzz driver of strata's C ABI (issue 13): one interpreter of call scripts, run
//! coverage-guided by `cargo +nightly fuzz run capi` (`fuzz_targets/capi.rs`) and from
//! seeded PRNG bytes by `capi-seeded` (CI and the long runs, on stable).
//!
//! A script ([`script`]) is a sequence of worlds: a local world of 1..=8 ranks (random
//! `nodes:AxB` topology, algorithm, `strataCommInitLocal` or unique id + per-thread
//! `strataCommInitRank[Config]`), driven by one thread per rank in lockstep ([`world`]).
//! Steps: valid collectives of every export, dtype, op, root, count (0, odd, large),
//! in place or not, misaligned, plain / grouped / nested / one thread driving all ranks /
//! several in one group, split into parts, a side world; each checked against a plain
//! reference ([`coll`], [`data`]). Bad calls ([`bad`]) interleave: NULL, foreign and
//! destroyed handles, bad dtypes, ops, roots, peers, NULL and wrapping and overlapping
//! buffers, overflowing counts, bad quantization formats, bad ids and configs, bad
//! splits, group misuse; each must return the code the header documents, with a
//! message ([`ffi`]). A world ends by destroy, abort, abort from another thread during
//! a collective, destroy during work, or abandoned groups; then the next is built.
//!
//! Everything is counted in [`stats::STATS`]; failures are collected, not panicked, so
//! that no rank thread is left waiting at a barrier.

pub mod bad;
pub mod coll;
pub mod data;
pub mod ffi;
pub mod script;
pub mod stats;
pub mod world;

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// Limits of a script run.
#[derive(Clone, Debug)]
pub struct Opts {
    /// Largest world (ranks, each a thread).
    pub max_n: usize,
    pub max_steps: usize,
    pub max_worlds: usize,
    /// The communicators' timeout (`STRATA_TIMEOUT` and the configs' `timeout_ms`).
    pub timeout_ms: u64,
}

impl Default for Opts {
    fn default() -> Opts {
        Opts {
            max_n: 8,
            max_steps: 24,
            max_worlds: 6,
            timeout_ms: 2000,
        }
    }
}

/// Set the process's strata environment: the timeout, and no transport, topology or
/// algorithm from the caller's environment. Call before any thread starts.
pub fn setup(opts: &Opts) {
    // SAFETY-free: std::env::set_var is safe in edition 2021; called single-threaded.
    std::env::set_var(
        "STRATA_TIMEOUT",
        format!("{}", opts.timeout_ms as f64 / 1000.0),
    );
    for v in [
        "STRATA_TRANSPORT",
        "STRATA_TOPOLOGY",
        "STRATA_ALGO",
        "STRATA_DEBUG",
    ] {
        std::env::remove_var(v);
    }
}

/// Interpret `data` as a script; returns the failures it found.
pub fn run_script(data: &[u8], opts: &Opts, label: &str) -> Vec<String> {
    let mut d = script::Dec(arbitrary::Unstructured::new(data));
    let mut dead = Vec::new();
    for i in 0..opts.max_worlds {
        if i > 0 && d.done() {
            break;
        }
        let w = script::world(&mut d, opts.max_n, opts.max_steps, opts.timeout_ms);
        world::run(&w, &mut dead, &format!("{label} world {i}"));
    }
    stats::STATS.take_failures()
}

/// Fail the process (exit 3, printing `what()`) when no C call completes for `limit`.
pub fn watchdog(limit: Duration, what: impl Fn() -> String + Send + 'static) {
    std::thread::Builder::new()
        .name("watchdog".into())
        .spawn(move || {
            let (mut last, mut since) = (u64::MAX, Instant::now());
            loop {
                std::thread::sleep(Duration::from_millis(500));
                let now = stats::STATS.calls.load(Relaxed);
                if now != last {
                    (last, since) = (now, Instant::now());
                } else if since.elapsed() >= limit {
                    eprintln!(
                        "HANG: no C call completed for {} s at call {now}: {}",
                        limit.as_secs(),
                        what()
                    );
                    eprintln!("{}", stats::STATS.table());
                    std::process::exit(3);
                }
            }
        })
        .expect("spawn the watchdog");
}
