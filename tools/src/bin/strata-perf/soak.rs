//! `--soak SECS`: a time-bounded random mix of checked collectives.
//!
//! Every rank derives the same schedule from `--seed` (ChaCha8, so the schedule is the
//! same on every machine): rounds of 1..=6 items, each either ONE collective on one of
//! the soak's communicators (world, its level, node and rail communicators, odd/even
//! ranks, pairs, the world in reverse order, a random subset, a split of a split) with a
//! random op, algorithm valid for that communicator and op, dtype, reduction, count (0,
//! odd, up to 256K elements), in place or not, sometimes `after` an earlier item on
//! another communicator, the singles of a round sometimes in one group; or a CHAIN: a
//! collective on one communicator feeding the next on another while both are in flight
//! (`Request::after`), over a grid of two orthogonal sub-communicators X (blocks of k
//! consecutive ranks) and Y (every k-th rank), so the composition is a known collective
//! of the base communicator: all-reduce on X then Y, reduce-scatter on Y then X,
//! all-gather on X then Y, reduce-scatter on Y then all-reduce on X, and the 2-D
//! all-reduce (reduce-scatter Y, X, all-gather X, Y), in place on one buffer or not.
//! The round's handles are waited in a random order and every result is compared with
//! [`strata::check`]'s references (`Kind::expected`, exact to a few ulps;
//! [`strata::check::check_quant`]'s bound for `qgz`, `qgz-1hop`, `qwz`).
//!
//! Inputs are `check::fill(dtype, rank, .., seed)` with a seed per item from
//! (`--seed`, op index). After every round the ranks all-reduce (world, ring) their
//! "time is up" flags and mismatch counts, so all stop after the same round, whatever
//! their clocks say, and at the first round with a mismatch. Each mismatch is printed
//! with the seed and its op index; the run exits 1.

mod run;
mod schedule;
mod setup;

use crate::cli::Cli;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use run::{describe, run_chain, run_single, Pending};
use schedule::draw_round;
use setup::{agree, gib, line, setup, Body, Grid, Item, Slot, Stats, PROGRESS};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use strata::{group_end, group_start, Comm, CommConfig, Error, ReduceOp, Result, Topology, Work};

/// What one rank reports at the end.
pub(crate) struct RankSoak {
    /// Mismatching elements over all ranks (agreed).
    pub(crate) wrong: u64,
}

/// One rank's soak: setup, rounds until the agreed stop, the summary on rank 0.
/// On an error every communicator of the soak is aborted, so the peers fail at once.
fn soak_rank(w: &Comm, secs: f64, seed: u64, header: &str) -> Result<RankSoak> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (slots, grids) = match setup(w, &mut rng) {
        Ok(x) => x,
        Err(e) => {
            w.abort();
            return Err(e);
        }
    };
    let r = rounds(w, &slots, &grids, &mut rng, secs, seed, header);
    if r.is_err() {
        slots
            .iter()
            .filter_map(|s| s.comm.as_ref())
            .for_each(|c| c.abort());
    }
    r
}

#[allow(clippy::too_many_arguments)]
fn rounds(
    w: &Comm,
    slots: &[Slot],
    grids: &[Grid],
    rng: &mut ChaCha8Rng,
    secs: f64,
    seed: u64,
    header: &str,
) -> Result<RankSoak> {
    let me = w.rank();
    if me == 0 {
        println!("{header}");
        let list: Vec<String> = slots
            .iter()
            .map(|s| format!("{}({})", s.name, s.size))
            .collect();
        println!("#  comms     : {}", list.join(" "));
        let gl: Vec<String> = grids
            .iter()
            .map(|g| {
                format!(
                    "{} = {} x {}",
                    slots[g.base].name, slots[g.x].name, slots[g.y].name
                )
            })
            .collect();
        println!(
            "#  grids     : {}",
            if gl.is_empty() {
                "none (no chains)".into()
            } else {
                gl.join(", ")
            }
        );
    }
    let t0 = Instant::now();
    let deadline = Duration::from_secs_f64(secs);
    let mut last = t0;
    let mut stats = Stats::default();
    let mut next = 0u64;
    let mut wrong_total = 0u64;
    loop {
        let items = draw_round(rng, slots, grids, seed, &mut next, &mut stats);
        stats.rounds += 1;
        let order_seed: u64 = rng.random();
        let mut pending: Vec<Pending> = Vec::new();
        let mut works_of: Vec<Vec<Work>> = vec![Vec::new(); items.len()];
        let mut in_group = false;
        for (i, item) in items.iter().enumerate() {
            let r = match &item.body {
                Body::One(s) => {
                    let Some(comm) = &slots[s.slot].comm else {
                        continue;
                    };
                    if s.grouped && !in_group {
                        group_start();
                        in_group = true;
                    }
                    let deps = s.dep.map(|d| works_of[d].clone()).unwrap_or_default();
                    run_single(comm, s, item.seed, deps)
                }
                Body::Chain(c) => {
                    if in_group {
                        group_end()?;
                        in_group = false;
                    }
                    run_chain(slots, &grids[c.grid], c, item.seed)
                }
            };
            let (works, verify) = match r {
                Ok(x) => x,
                Err(e) => {
                    if in_group {
                        let _ = group_end();
                    }
                    return Err(at(e, seed, item, slots, grids));
                }
            };
            works_of[i] = works.clone();
            pending.push(Pending {
                item: i,
                works,
                verify,
            });
        }
        if in_group {
            group_end()?;
        }
        // Wait out of order: every handle of the round in a shuffled order.
        let mut order: Vec<(usize, usize)> = pending
            .iter()
            .enumerate()
            .flat_map(|(pi, p)| (0..p.works.len()).map(move |wi| (pi, wi)))
            .collect();
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(order_seed));
        for (pi, wi) in order {
            let p = &pending[pi];
            if let Err(e) = p.works[wi].wait() {
                print_round(me, stats.rounds, &items, slots, grids);
                return Err(at(e, seed, &items[p.item], slots, grids));
            }
        }
        let mut wrong_here = 0u64;
        for p in pending {
            let item = &items[p.item];
            let wrong = (p.verify)().map_err(|e| at(e.clone(), seed, item, slots, grids))?;
            if wrong > 0 {
                wrong_here += wrong as u64;
                eprintln!(
                    "MISMATCH rank {me}: seed {seed} op #{}: {wrong} wrong element(s): {}",
                    item.index,
                    describe(item, slots, grids)
                );
            }
        }
        if wrong_here > 0 {
            print_round(me, stats.rounds, &items, slots, grids);
        }
        let up = i32::from(t0.elapsed() >= deadline);
        let agreed = agree(w, &[up, wrong_here.min(1 << 30) as i32], ReduceOp::Sum)?;
        wrong_total += agreed[1] as u64;
        if me == 0 && (last.elapsed() >= PROGRESS || agreed[0] > 0 || agreed[1] > 0) {
            last = Instant::now();
            println!(
                "# [{:7.1} s] {} collectives, {}, {} wrong element(s)",
                t0.elapsed().as_secs_f64(),
                stats.ops,
                gib(stats.bytes),
                wrong_total
            );
        }
        if agreed[0] > 0 || agreed[1] > 0 {
            break;
        }
    }
    if me == 0 {
        let el = t0.elapsed().as_secs_f64();
        println!(
            "# soak done: {} collectives in {} rounds, {:.1} s ({:.0}/s), {} checked, failures={}",
            stats.ops,
            stats.rounds,
            el,
            stats.ops as f64 / el.max(1e-9),
            gib(stats.bytes),
            wrong_total
        );
        println!("#  by op    :{}", line(&stats.by_op));
        println!("#  by algo  :{}", line(&stats.by_algo));
        println!("#  by comm  :{}", line(&stats.by_comm));
        println!("#  by dtype :{}", line(&stats.by_dtype));
        println!(
            "#  chains   :{}{}",
            line(&stats.chains),
            if stats.chains.is_empty() { " none" } else { "" }
        );
        println!(
            "#  groups {}, in place {}, cross-communicator waits {}, zero counts {}",
            stats.groups, stats.in_place, stats.deps, stats.zero
        );
        if wrong_total > 0 {
            println!("# reproduce: the same command with --seed {seed} (ops are numbered from 0 in schedule order)");
        }
    }
    Ok(RankSoak { wrong: wrong_total })
}

/// The items of a failed round, on stderr.
fn print_round(me: usize, round: u64, items: &[Item], slots: &[Slot], grids: &[Grid]) {
    for it in items {
        eprintln!(
            "rank {me}: round {round}: op #{}: {}",
            it.index,
            describe(it, slots, grids)
        );
    }
}

/// `e` with the seed and op of the item it happened in.
fn at(e: Error, seed: u64, item: &Item, slots: &[Slot], grids: &[Grid]) -> Error {
    let what = format!(
        "seed {seed} op #{} ({})",
        item.index,
        describe(item, slots, grids)
    );
    match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("{what}: {m}")),
        Error::InvalidUsage(m) => Error::InvalidUsage(format!("{what}: {m}")),
        Error::Remote(m) => Error::Remote(format!("{what}: {m}")),
        Error::System(m) => Error::System(format!("{what}: {m}")),
        Error::Device(m) => Error::Device(format!("{what}: {m}")),
        Error::Internal(m) => Error::Internal(format!("{what}: {m}")),
        e => e,
    }
}

fn header(cli: &Cli, w: &Comm, secs: f64, seed: u64) -> String {
    format!(
        "# strata-perf soak: random checked collectives\n#  transport : {}\n#  topology  : {}\n#  ranks     : {}\n#  seconds   : {secs}\n#  seed      : {seed}  (reproduce with --seed {seed})\n#  timeout   : {}s",
        cli.transport.name(),
        w.topology().summary(),
        w.size(),
        w.timeout().as_secs_f64()
    )
}

fn the_seed(cli: &Cli) -> u64 {
    cli.seed
        .unwrap_or_else(|| rand::rng().random_range(0..1u64 << 48))
}

/// `--soak` on the local transport: one thread per rank.
pub(crate) fn soak_local(cli: &Cli, config: CommConfig, topo: Option<Topology>) -> Result<u64> {
    let secs = cli.soak.unwrap_or(0.0);
    let ranks = match (cli.ranks, &topo) {
        (Some(n), _) => n as usize,
        (None, Some(t)) => t.world_size(),
        (None, None) => 8,
    };
    let topo = topo.unwrap_or_else(|| Topology::flat(ranks));
    let comms = Comm::local_world(ranks, Some(topo), config)?;
    let seed = the_seed(cli);
    let head = header(cli, &comms[0], secs, seed);
    let (tx, rx) = mpsc::channel::<(usize, Result<RankSoak>)>();
    let mut handles = Vec::new();
    for comm in comms {
        let (tx, head) = (tx.clone(), head.clone());
        let r = comm.rank();
        let h = std::thread::Builder::new()
            .name(format!("strata-soak-r{r}"))
            .spawn(move || {
                let _ = tx.send((r, soak_rank(&comm, secs, seed, &head)));
            })
            .map_err(|e| Error::System(format!("cannot start a rank thread: {e}")))?;
        handles.push(h);
    }
    drop(tx);
    let mut first: Option<(usize, Error)> = None;
    let mut wrong = 0;
    for (r, res) in rx {
        match res {
            Ok(s) => wrong = wrong.max(s.wrong),
            Err(e) => {
                let consequence = |e: &Error| e.to_string().contains("aborted");
                match &first {
                    Some((_, f)) if !consequence(f) || consequence(&e) => {}
                    _ => first = Some((r, e)),
                }
            }
        }
    }
    for (r, h) in handles.into_iter().enumerate() {
        if h.join().is_err() {
            return Err(Error::Internal(format!("rank {r} thread panicked")));
        }
    }
    match first {
        Some((r, e)) => Err(Error::Remote(format!("rank {r}: {e}"))),
        None => Ok(wrong),
    }
}

/// `--soak` under mpirun: one rank per process.
pub(crate) fn soak_mpi(cli: &Cli, config: CommConfig, topo: Option<Topology>) -> Result<u64> {
    let w = Comm::mpi_world(topo, config)?;
    if let Some(n) = cli.ranks {
        if n as usize != w.size() {
            return Err(Error::InvalidUsage(format!(
                "--ranks {n} but the MPI job has {} processes (omit --ranks with mpi)",
                w.size()
            )));
        }
    }
    // Rank 0's seed for everyone.
    let seed = the_seed(cli);
    let parts = [(seed & 0xFFFF_FF) as i32, (seed >> 24) as i32];
    let mine = if w.rank() == 0 { parts } else { [0, 0] };
    let s = agree(&w, &mine, ReduceOp::Sum)?;
    let seed = (s[0] as u64 & 0xFFFF_FF) | ((s[1] as u64) << 24);
    let head = header(cli, &w, cli.soak.unwrap_or(0.0), seed);
    let r = soak_rank(&w, cli.soak.unwrap_or(0.0), seed, &head);
    match r {
        Ok(s) => Ok(s.wrong),
        Err(e) => Err(Error::Remote(format!("rank {}: {e}", w.rank()))),
    }
}
