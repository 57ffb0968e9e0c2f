//! The seeded driver of the C ABI fuzzer: episodes of PRNG bytes (ChaCha8 from
//! `--seed` and the episode number) run as call scripts until `--calls` C calls have
//! been made; prints the summary table; exits 1 on a failed check (printing the seed
//! and episode that reproduce it: `--seed S --start-episode E --calls 1`), 3 on a hang
//! (no call completing for `--hang-secs`).

use clap::Parser;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_fuzz::{run_script, setup, stats::STATS, watchdog, Opts};

#[derive(Parser)]
#[command(about = "Seeded random call scripts against strata's C ABI")]
struct Args {
    /// Stop after this many C calls (counted across all threads).
    #[arg(long, default_value_t = 50_000)]
    calls: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// First episode (to replay one that failed).
    #[arg(long, default_value_t = 0)]
    start_episode: u64,
    /// Largest world: ranks, one thread each.
    #[arg(long, default_value_t = 8)]
    threads: usize,
    /// Bytes of script per episode.
    #[arg(long, default_value_t = 2048)]
    episode_bytes: usize,
    /// The communicators' timeout in milliseconds (raise it under valgrind).
    #[arg(long, default_value_t = 2000)]
    timeout_ms: u64,
    /// A hang: no C call completes for this long.
    #[arg(long, default_value_t = 30)]
    hang_secs: u64,
    /// Print the distinct (normalised) error messages too.
    #[arg(long)]
    messages: bool,
}

fn main() {
    let a = Args::parse();
    let opts = Opts {
        max_n: a.threads.clamp(1, 64),
        timeout_ms: a.timeout_ms,
        ..Opts::default()
    };
    setup(&opts);
    let episode = Arc::new(AtomicU64::new(a.start_episode));
    let (seed, ep) = (a.seed, episode.clone());
    watchdog(Duration::from_secs(a.hang_secs), move || {
        format!("seed {seed} episode {}", ep.load(Relaxed))
    });
    let t0 = Instant::now();
    let mut bytes = vec![0u8; a.episode_bytes];
    let mut e = a.start_episode;
    while STATS.calls.load(Relaxed) < a.calls {
        episode.store(e, Relaxed);
        let mut rng = ChaCha8Rng::seed_from_u64(a.seed);
        rng.set_stream(e);
        rng.fill_bytes(&mut bytes);
        let failures = run_script(&bytes, &opts, &format!("seed {} episode {e}", a.seed));
        if !failures.is_empty() {
            for f in &failures {
                eprintln!("FAIL {f}");
            }
            eprintln!(
                "capi-seeded: {} failed check(s); replay: capi-seeded --seed {} --start-episode {e} --calls 1 --threads {}",
                failures.len(),
                a.seed,
                a.threads
            );
            eprintln!("{}", STATS.table());
            std::process::exit(1);
        }
        e += 1;
    }
    println!(
        "capi-seeded: seed {} episodes {}..{e} in {:.1} s, crashes 0, hangs 0",
        a.seed,
        a.start_episode,
        t0.elapsed().as_secs_f64()
    );
    print!("{}", STATS.table());
    if a.messages {
        for m in STATS.messages() {
            println!("  {m}");
        }
    }
    if STATS.internal.load(Relaxed) > 0 {
        std::process::exit(1);
    }
}
