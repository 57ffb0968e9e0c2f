//! The link probe: the link figures of a world measured on the world itself, so that
//! `auto`, the model, the simulator and the planner decide from the machine rather than
//! from a preset (`STRATA_LINKS=probe`, the C config's `links`, `strata-perf --probe`).
//!
//! What it measures, for each link class the world spans (within a package, a node,
//! between nodes), with every rank busy at once as in a collective's step: each rank
//! sends to the next rank of its ring at that level and receives from the previous one
//! (same package, die and node but the next node for `inter_node`, and so on), each
//! rank's median step, [`SMALL_BYTES`] for the latency (the median of [`ALPHA_ROUNDS`]
//! rounds), then messages growing by 4x from
//! 64 KiB until one step takes [`TARGET_STEP_US`] (or reaches [`MAX_BYTES`]) for the
//! bandwidth: `α = t(small)`, `β = s / (t(s) − min(α, t(s)/4))`, one rank's share (for
//! `inter_node`, the node's ranks share its links: `nic_bandwidth_gbs = β ·
//! ranks_per_node` on one NIC). With two classes or more, a step on all at once gives
//! their overlap ([`crate::topology::Links::overlap`]); with the two levels `ho-ring`
//! needs, small `hier` and `ho-ring` all-gathers give `ho-ring`'s handoff cost
//! ([`crate::topology::Links::handoff_us`]). On host transports it also
//! times the host path's copy and f32 sum reduction with every rank at work
//! ([`crate::topology::HostSpec`]). A class the world does not span keeps the preset's
//! figures; the result is the world's topology with the measured figures and a
//! [`Measured`] record, valid for every consumer of a topology file.
//!
//! Agreement: every decision (the next message size) and every figure comes from values
//! all-gathered from every rank and combined the same way (the median over ranks), so
//! every rank builds the same topology bit for bit and `auto` picks the same algorithm
//! on every rank, whatever each rank measured. `STRATA_PROBE_NOISE=F` scales each rank's
//! timings by its own random factor in [1−F, 1+F] to test exactly that.
//!
//! Cache: rank 0 keeps the result in `STRATA_LINKS_CACHE` (default
//! `$XDG_CACHE_HOME/strata`, else `~/.cache/strata`, else the temp dir) under a key
//! hashing the transport, the layout and every rank's host ([`crate::topology::detect`]);
//! rank 0 reads it back and broadcasts its bytes, so a second run of the same host set
//! measures nothing and still agrees. `reprobe` ignores the cache and rewrites it. A
//! cache that cannot be written costs a warning, never the communicator.
//!
//! Runs over every transport (host buffers on host transports, device buffers of the
//! communicator's device on GPU ones) with the communicator's own send/receive and
//! all-gather, forced to `ring`; the world must be the whole topology in rank order.

#![forbid(unsafe_code)]

use super::{Comm, Op, Request};
use crate::algo::Algo;
use crate::config::LinkSource;
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::memory::Buffer;
use crate::topology::{Coord, HostSpec, LinkClass, LinkSpec, Measured, Topology};
use crate::transport::TransportKind;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Bytes of the latency exchange.
pub const SMALL_BYTES: usize = 8;
/// Rounds of latency steps (their median is the latency).
pub const ALPHA_ROUNDS: usize = 3;
/// Rounds of the overlap measurement (its figure is their median).
pub const OVERLAP_ROUNDS: usize = 3;
/// Latency steps per round.
pub const ALPHA_STEPS: usize = 10;
/// First bandwidth message, bytes.
pub const FIRST_BYTES: usize = 64 << 10;
/// Largest bandwidth message, bytes.
pub const MAX_BYTES: usize = 4 << 20;
/// A bandwidth step at least this long (µs, agreed over ranks) ends the growth.
pub const TARGET_STEP_US: f64 = 20_000.0;
/// Bytes per rank of the handoff calls.
pub const HANDOFF_BYTES: usize = 8 << 10;
/// Calls of each algorithm timed for the handoff.
pub const HANDOFF_CALLS: usize = 10;
/// Bytes of the host copy / reduction timing.
pub const HOST_BYTES: usize = 4 << 20;

/// How to run the probe ([`ProbeOptions::from_env`] reads the environment).
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    /// Measure even when the cache has this host set.
    pub fresh: bool,
    /// Where the cache lives; `None`: no cache.
    pub cache: Option<PathBuf>,
    /// Testing aid: each rank scales its timings by a factor in [1−noise, 1+noise].
    pub noise: f64,
    /// Seed of the injected noise.
    pub seed: u64,
}

impl ProbeOptions {
    /// `fresh` for `reprobe`; the cache directory and noise from the environment.
    pub fn from_env(source: LinkSource) -> Result<ProbeOptions> {
        let e = crate::config::env()?;
        Ok(ProbeOptions {
            fresh: source == LinkSource::Reprobe,
            cache: Some(e.links_cache.unwrap_or_else(default_cache_dir)),
            noise: e.probe_noise,
            seed: 0x5eed,
        })
    }
}

/// `$XDG_CACHE_HOME/strata`, else `$HOME/.cache/strata`, else `<temp>/strata-cache`
/// ([`crate::config::cache_dir`]).
pub fn default_cache_dir() -> PathBuf {
    crate::config::cache_dir()
}

/// The cache file of `key` in `dir`.
pub fn cache_file(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("links-{key}.json"))
}

/// The world's topology with measured link figures (module doc). Collective: every rank
/// of `comm` calls it with the same options.
pub fn probe(comm: &Comm, opts: &ProbeOptions) -> Result<Topology> {
    let started = Instant::now();
    let topo = comm.topology().as_ref().clone();
    let p = comm.size();
    if p != topo.world_size() || comm.members().iter().enumerate().any(|(i, &m)| i != m) {
        return Err(Error::InvalidUsage(format!(
            "the link probe runs on a whole world in rank order ({} ranks of {})",
            p,
            topo.summary()
        )));
    }
    let key = host_key(comm)?;
    if !opts.fresh {
        if let Some(t) = cached(comm, opts.cache.as_deref(), &key, &topo)? {
            tracing::info!(
                rank = comm.rank(),
                key,
                "link figures from the probe's cache"
            );
            return Ok(t);
        }
    }
    let mut prober = Prober {
        comm,
        opts,
        index: 0,
    };
    let mut out = topo.clone();
    let mut classes = Vec::new();
    for class in spanned(&topo) {
        let spec = prober.link(class)?;
        classes.push(class);
        match class {
            LinkClass::InterNode => {
                out.links.lone_latency_us = prober.lone_latency()?;
                out.links.inter_node = spec;
                out.links.nics_per_node = 1;
                out.links.nic_bandwidth_gbs = spec.bandwidth_gbs * topo.ranks_per_node() as f64;
            }
            LinkClass::IntraNode => {
                out.links.intra_node = spec;
                // Dies of one package are at least as close as packages of one node.
                if topo.dies_per_package == 1 {
                    out.links.intra_package = spec;
                }
            }
            LinkClass::IntraPackage => out.links.intra_package = spec,
        }
    }
    out.links.overlap = if classes.len() >= 2 {
        Some(prober.overlap(&classes, &out)?)
    } else {
        None
    };
    // The host path's own work, where the host does it (host-local's device is the CPU).
    out.links.host = match comm.transport_kind() {
        TransportKind::Nccl | TransportKind::Rccl | TransportKind::CudaLocal => None,
        _ => Some(prober.host()?),
    };
    // What a pipelined hierarchical algorithm pays beyond its links, on the figures above.
    out.links.handoff_us = match comm.hierarchy() {
        Some(h) if h.levels.len() >= 2 => Some(prober.handoff(&out)?),
        _ => None,
    };
    out.measured = Some(Measured {
        transport: comm.transport_kind().name().to_string(),
        host_key: key.clone(),
        classes,
        seconds: prober.agree_one(started.elapsed().as_secs_f64(), Agree::Max)?,
        // Agreed too (the latest clock): read on each rank, a second could tick between
        // them, and the ranks' figures must be equal byte for byte.
        unix_time: all_gather_u64(
            comm,
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        )?
        .into_iter()
        .max()
        .unwrap_or(0),
    });
    out.validate()?;
    if comm.rank() == 0 {
        if let Some(dir) = &opts.cache {
            if let Err(e) = store(dir, &key, &out) {
                tracing::warn!(
                    "link probe: cannot keep its figures in {}: {e}",
                    dir.display()
                );
            }
        }
    }
    tracing::info!(
        rank = comm.rank(),
        seconds = out.measured.as_ref().map(|m| m.seconds),
        links = ?out.links,
        "link probe"
    );
    Ok(out)
}

/// The link classes `topo` spans, fastest first.
pub fn spanned(topo: &Topology) -> Vec<LinkClass> {
    let mut v = Vec::new();
    if topo.dies_per_package > 1 {
        v.push(LinkClass::IntraPackage);
    }
    if topo.packages_per_node > 1 {
        v.push(LinkClass::IntraNode);
    }
    if topo.nodes > 1 {
        v.push(LinkClass::InterNode);
    }
    v
}

/// The ranks `rank` sends to and receives from in the ring of `class`: the next and
/// previous node (package, die) with the rest of its coordinates unchanged.
pub fn ring_peers(topo: &Topology, class: LinkClass, rank: usize) -> (usize, usize) {
    let c = topo.coord(rank);
    let shift = |d: isize| {
        let wrap = |x: usize, n: usize| (x as isize + d).rem_euclid(n.max(1) as isize) as usize;
        let to = match class {
            LinkClass::InterNode => Coord {
                node: wrap(c.node, topo.nodes),
                ..c
            },
            LinkClass::IntraNode => Coord {
                package: wrap(c.package, topo.packages_per_node),
                ..c
            },
            LinkClass::IntraPackage => Coord {
                die: wrap(c.die, topo.dies_per_package),
                ..c
            },
        };
        topo.rank_of(to)
    };
    (shift(1), shift(-1))
}

/// How [`Prober::agree_one`] combines one value over ranks.
#[derive(Clone, Copy)]
enum Agree {
    Median,
    Max,
}

struct Prober<'a> {
    comm: &'a Comm,
    opts: &'a ProbeOptions,
    /// Values agreed so far (the noise of each is its own draw).
    index: u64,
}

impl Prober<'_> {
    /// `α` and `β` of `class`.
    fn link(&mut self, class: LinkClass) -> Result<LinkSpec> {
        // The median of three rounds (each already agreed): a scheduler's slow spell
        // over one round's steps must not become the link's latency.
        let mut rounds = Vec::with_capacity(ALPHA_ROUNDS);
        for _ in 0..ALPHA_ROUNDS {
            rounds.push(self.step_us(class, SMALL_BYTES, ALPHA_STEPS)?);
        }
        let alpha = median(&mut rounds);
        let mut bytes = FIRST_BYTES;
        let t = loop {
            let t = self.step_us(class, bytes, 3)?;
            if t >= TARGET_STEP_US || bytes >= MAX_BYTES {
                break t;
            }
            bytes *= 4;
        };
        // The bytes' own time: a step of at least TARGET_STEP_US less the latency, which
        // counts for at most a quarter of it (8-byte steps can wait on the host's
        // scheduler for longer than a full step's bytes take).
        Ok(LinkSpec {
            bandwidth_gbs: bytes as f64 / (t - alpha.min(t / 4.0)) / 1e3,
            latency_us: alpha,
        })
    }

    /// [`crate::topology::Links::lone_latency_us`]: the inter-node latency step with
    /// only each node's first rank crossing (to the next node's first rank) while the
    /// others wait, [`ALPHA_ROUNDS`] rounds of [`ALPHA_STEPS`], each the median over the
    /// crossing ranks of their median step; the median round. `None` with one rank per
    /// node (every step is a lone one: `inter_node`'s latency already).
    fn lone_latency(&mut self) -> Result<Option<f64>> {
        let c = self.comm;
        let t = c.topology();
        if t.ranks_per_node() <= 1 {
            return Ok(None);
        }
        let lead = t.local_rank(c.rank()) == 0;
        let (to, from) = ring_peers(t, LinkClass::InterNode, c.rank());
        let (send, recv) = (c.alloc_native(SMALL_BYTES)?, c.alloc_native(SMALL_BYTES)?);
        let step = || -> Result<f64> {
            let t0 = Instant::now();
            send_recv(c, &send, &recv, SMALL_BYTES, to, from)?.wait()?;
            Ok(t0.elapsed().as_secs_f64() * 1e6)
        };
        let mut rounds = Vec::with_capacity(ALPHA_ROUNDS);
        for _ in 0..ALPHA_ROUNDS {
            c.barrier()?;
            let mine = if lead {
                step()?;
                let mut each = (0..ALPHA_STEPS)
                    .map(|_| step())
                    .collect::<Result<Vec<_>>>()?;
                median(&mut each)
            } else {
                f64::NAN
            };
            rounds.push(self.agree_one(mine, Agree::Median)?);
        }
        Ok(Some(median(&mut rounds)))
    }

    /// Agreed time (µs) of one ring step of `bytes` on `class`: one warm-up step, then
    /// `iters` steps, each waited; the median over ranks.
    fn step_us(&mut self, class: LinkClass, bytes: usize, iters: usize) -> Result<f64> {
        self.steps_us(&[(class, bytes)], iters)
    }

    /// [`Prober::step_us`] with a step on every class of `classes` at once (one group),
    /// each with its own message size.
    fn steps_us(&mut self, classes: &[(LinkClass, usize)], iters: usize) -> Result<f64> {
        let c = self.comm;
        let mut ops = Vec::new();
        for &(class, bytes) in classes {
            let (to, from) = ring_peers(c.topology(), class, c.rank());
            ops.push((
                to,
                from,
                bytes,
                c.alloc_native(bytes)?,
                c.alloc_native(bytes)?,
            ));
        }
        let step = || -> Result<()> {
            super::group_start();
            // One class: a send-recv step, the rings' own primitive. Several: sends and
            // receives, a group's point-to-point ops being in flight together.
            let works: Vec<Result<super::Work>> = if ops.len() == 1 {
                let (to, from, bytes, send, recv) = &ops[0];
                vec![send_recv(c, send, recv, *bytes, *to, *from)]
            } else {
                ops.iter()
                    .flat_map(|(to, from, bytes, send, recv)| {
                        [
                            Op::Send {
                                buf: send.clone(),
                                count: *bytes,
                                peer: *to,
                            },
                            Op::Recv {
                                buf: recv.clone(),
                                count: *bytes,
                                peer: *from,
                            },
                        ]
                    })
                    .map(|op| c.submit(Request::new(op, DataType::U8)))
                    .collect()
            };
            super::group_end()?;
            for w in works {
                w?.wait()?;
            }
            Ok(())
        };
        step()?;
        c.barrier()?;
        // The median step of this rank: a transport's rare stall (a TCP retransmission)
        // must not become the link's figure.
        let mut each = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t0 = Instant::now();
            step()?;
            each.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        self.agree_one(median(&mut each), Agree::Median)
    }

    /// How far the link classes run at the same time (1: a step on all of them takes as
    /// long as the slowest alone, as NVLink beside a NIC; 0: as long as all of them one
    /// after another, as ranks of one host sharing its cores): a step on every class at
    /// once, the slowest class sized by its figures just measured to take
    /// [`TARGET_STEP_US`] / 2 alone and the others a quarter of that, the load of a
    /// pipelined hierarchical algorithm whose slow level paces the fast ones; the median
    /// of [`OVERLAP_ROUNDS`] rounds.
    fn overlap(&mut self, classes: &[LinkClass], t: &Topology) -> Result<f64> {
        let slowest = classes
            .iter()
            .copied()
            .min_by(|a, b| {
                t.links
                    .get(*a)
                    .bandwidth_gbs
                    .total_cmp(&t.links.get(*b).bandwidth_gbs)
            })
            .unwrap_or(LinkClass::InterNode);
        let sized: Vec<(LinkClass, usize)> = classes
            .iter()
            .map(|&c| {
                let want = TARGET_STEP_US / if c == slowest { 2.0 } else { 8.0 };
                let l = t.links.get(c);
                let bytes = ((want - l.latency_us).max(want / 2.0) * l.bandwidth_gbs * 1e3)
                    .clamp(SMALL_BYTES as f64, MAX_BYTES as f64)
                    as usize;
                (c, bytes)
            })
            .collect();
        let pairs = sized;
        // The median of rounds: one round's slow spell (a stall in its step on all
        // classes, or in one class alone) reads as no overlap, or as full overlap.
        let mut rounds = Vec::with_capacity(OVERLAP_ROUNDS);
        for _ in 0..OVERLAP_ROUNDS {
            let both = self.steps_us(&pairs, 3)?;
            // Each class alone the same way (its sends and receives as a group of one
            // class, with a zero-byte partner class keeping the path the same).
            let mut alone = Vec::new();
            for &(c, b) in &pairs {
                let other = pairs.iter().find(|p| p.0 != c).map_or(c, |p| p.0);
                alone.push(self.steps_us(&[(c, b), (other, 0)], 3)?);
            }
            let sum: f64 = alone.iter().sum();
            let max = alone.iter().cloned().fold(0.0, f64::max);
            // both = max + (1 − overlap)·(sum − max).
            rounds.push(if sum > max {
                (1.0 - (both - max) / (sum - max)).clamp(0.0, 1.0)
            } else {
                1.0
            });
        }
        Ok(median(&mut rounds))
    }

    /// [`crate::topology::Links::handoff_us`] on `t` (the figures measured so far): small
    /// `hier` and `ho-ring` all-gathers ([`HANDOFF_BYTES`] per rank), taken in turn
    /// [`HANDOFF_CALLS`] times each after a warm-up, each rank's median (a stall of the
    /// host is not a property of the algorithm), agreed; what `ho-ring` took beyond
    /// `hier` and beyond the model's own difference of the two, per unit of the model's
    /// handoff term, so that the model reproduces the measured difference at that size.
    fn handoff(&mut self, t: &Topology) -> Result<f64> {
        let c = self.comm;
        let (send, recv) = (
            c.alloc_native(HANDOFF_BYTES)?,
            c.alloc_native(HANDOFF_BYTES * c.size())?,
        );
        let call = |algo: Algo| -> Result<f64> {
            let t0 = Instant::now();
            c.submit(
                Request::new(
                    Op::AllGather {
                        send: send.clone(),
                        recv: recv.clone(),
                        count: HANDOFF_BYTES,
                    },
                    DataType::U8,
                )
                .with_algo(algo),
            )?
            .wait()?;
            Ok(t0.elapsed().as_secs_f64() * 1e6)
        };
        call(Algo::Hier)?;
        call(Algo::HoRing)?;
        c.barrier()?;
        let (mut hier, mut ho) = (Vec::new(), Vec::new());
        for _ in 0..HANDOFF_CALLS {
            hier.push(call(Algo::Hier)?);
            ho.push(call(Algo::HoRing)?);
        }
        let measured = self.agree_one(median(&mut ho), Agree::Median)?
            - self.agree_one(median(&mut hier), Agree::Median)?;
        let modeled = |handoff: f64| {
            let mut t = t.clone();
            t.links.handoff_us = Some(handoff);
            let e = crate::algo::select::estimates(&crate::algo::select::Shape {
                kind: Some(crate::kinds::Kind::AllGather),
                redop: None,
                count: HANDOFF_BYTES,
                dtype: DataType::U8,
                topo: &t,
                members: c.members(),
                hierarchy: c.hierarchy(),
                chunks: c.config().ho_ring_chunks,
            });
            e.ho_ring - e.hier
        };
        // The model is linear in the handoff: its slope per µs from two points.
        let base = modeled(0.0);
        let per_us = modeled(1.0) - base;
        Ok(if per_us > 0.0 {
            ((measured - base) / per_us).max(0.0)
        } else {
            0.0
        })
    }

    /// The host path's copy and reduction GB/s, every rank at once: each rank first
    /// finds its own speed alone (buffers grown from 256 KiB until a pass takes a
    /// millisecond); then, on a size agreed from the median of those, every rank makes
    /// two passes between two barriers, and the time between the barriers (the slowest
    /// rank's, with its node's ranks sharing the cores) gives one rank's share.
    fn host(&mut self) -> Result<HostSpec> {
        let ops = self.comm.core().ops();
        let alone = |f: &dyn Fn(&Buffer, &Buffer) -> Result<()>| -> Result<f64> {
            let mut bytes = 256 << 10;
            loop {
                let (a, b) = (Buffer::zeroed(bytes), Buffer::zeroed(bytes));
                f(&a, &b)?;
                let t0 = Instant::now();
                for _ in 0..3 {
                    f(&a, &b)?;
                }
                let us = t0.elapsed().as_secs_f64() * 1e6 / 3.0;
                if us >= 1_000.0 || bytes >= HOST_BYTES {
                    return Ok(bytes as f64 / us.max(1e-3) / 1e3);
                }
                bytes *= 4;
            }
        };
        let per_node = self.comm.topology().ranks_per_node().max(1) as f64;
        let mut shared = |f: &dyn Fn(&Buffer, &Buffer) -> Result<()>| -> Result<f64> {
            let solo = alone(f)?;
            let solo = self.agree_one(solo, Agree::Median)?;
            // A pass of about 2 ms with the node's ranks sharing.
            let want = solo * 1e3 * 2_000.0 / per_node;
            let bytes = (want as usize)
                .clamp(64 << 10, HOST_BYTES)
                .next_power_of_two();
            let (a, b) = (Buffer::zeroed(bytes), Buffer::zeroed(bytes));
            f(&a, &b)?;
            self.comm.barrier()?;
            let t0 = Instant::now();
            f(&a, &b)?;
            f(&a, &b)?;
            self.comm.barrier()?;
            let us = t0.elapsed().as_secs_f64() * 1e6;
            self.agree_one(2.0 * bytes as f64 / us.max(1e-3) / 1e3, Agree::Median)
        };
        let copy = shared(&|a, b| ops.copy(a, b))?;
        let reduce = shared(&|a, b| ops.reduce(a, b, DataType::F32, ReduceOp::Sum))?;
        Ok(HostSpec {
            copy_gbs: copy,
            reduce_gbs: reduce,
        })
    }

    /// `mine` (with this rank's injected noise) all-gathered and combined the same way on
    /// every rank; a rank that measured nothing passes NaN and is left out.
    fn agree_one(&mut self, mine: f64, how: Agree) -> Result<f64> {
        self.index += 1;
        let noisy = mine * noise_factor(self.opts, self.comm.rank(), self.index);
        let mut all: Vec<f64> = all_gather_u64(self.comm, noisy.to_bits())?
            .into_iter()
            .map(f64::from_bits)
            .filter(|v| !v.is_nan())
            .collect();
        Ok(match how {
            Agree::Max => all.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
            Agree::Median => median(&mut all),
        })
    }
}

/// One ring step: `bytes` of `send` to `to`, as many from `from` into `recv`.
fn send_recv(
    c: &Comm,
    send: &Buffer,
    recv: &Buffer,
    bytes: usize,
    to: usize,
    from: usize,
) -> Result<super::Work> {
    c.submit(Request::new(
        Op::SendRecv {
            send: send.clone(),
            recv: recv.clone(),
            count: bytes,
            dst: to,
            src: from,
            reduce: None,
        },
        DataType::U8,
    ))
}

/// The median of `v` (the mean of the middle two for an even length; 0 when empty).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// This rank's noise factor for agreed value `index`: 1 without noise, else uniform in
/// [1−noise, 1+noise] from a hash of (seed, rank, index).
fn noise_factor(opts: &ProbeOptions, rank: usize, index: u64) -> f64 {
    if opts.noise <= 0.0 {
        return 1.0;
    }
    let mut x = opts.seed ^ (rank as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ index << 32;
    // splitmix64
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    let u = (x >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
    1.0 + opts.noise * (2.0 * u - 1.0)
}

/// Every rank's `v`, in rank order (a ring all-gather of 8 bytes).
fn all_gather_u64(comm: &Comm, v: u64) -> Result<Vec<u64>> {
    let p = comm.size();
    let send = comm.native_from(&v.to_le_bytes())?;
    let recv = comm.alloc_native(8 * p)?;
    comm.submit(
        Request::new(
            Op::AllGather {
                send,
                recv: recv.clone(),
                count: 1,
            },
            DataType::U64,
        )
        .with_algo(Algo::Ring),
    )?
    .wait()?;
    Ok(recv
        .to_bytes()?
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect())
}

/// `bytes` of rank 0 on every rank (its length first).
fn broadcast_bytes(comm: &Comm, bytes: Option<Vec<u8>>) -> Result<Vec<u8>> {
    let mine = bytes.unwrap_or_default();
    let len = all_gather_u64(comm, mine.len() as u64)?[0] as usize;
    if len == 0 {
        return Ok(Vec::new());
    }
    let buf = comm.alloc_native(len)?;
    if comm.rank() == 0 {
        buf.write_bytes(&mine)?;
    }
    comm.submit(
        Request::new(
            Op::Broadcast {
                send: buf.clone(),
                recv: buf.clone(),
                count: len,
                root: 0,
            },
            DataType::U8,
        )
        .with_algo(Algo::Ring),
    )?
    .wait()?;
    buf.to_bytes()
}

/// The cache key of this world: FNV-1a of the transport, the layout and every rank's
/// host id, in rank order (the same on every rank).
pub fn host_key(comm: &Comm) -> Result<String> {
    let ids = all_gather_u64(comm, crate::topology::detect::host_id())?;
    let t = comm.topology();
    let mut text = format!(
        "{}|{}x{}x{}|",
        comm.transport_kind().name(),
        t.nodes,
        t.packages_per_node,
        t.dies_per_package
    );
    for id in ids {
        text.push_str(&format!("{id:016x},"));
    }
    Ok(format!(
        "{:016x}",
        crate::topology::detect::fnv1a(text.as_bytes())
    ))
}

/// Rank 0's cached topology for `key`, on every rank, when it has one of this layout.
fn cached(comm: &Comm, dir: Option<&Path>, key: &str, topo: &Topology) -> Result<Option<Topology>> {
    let mine = match (comm.rank(), dir) {
        (0, Some(d)) => std::fs::read(cache_file(d, key)).ok(),
        _ => None,
    };
    let bytes = broadcast_bytes(comm, mine)?;
    if bytes.is_empty() {
        return Ok(None);
    }
    // Every rank parses the same bytes: the same outcome everywhere.
    let t = match std::str::from_utf8(&bytes)
        .ok()
        .and_then(|s| Topology::from_json(s).ok())
    {
        Some(t) => t,
        None => return Ok(None),
    };
    let same = t.nodes == topo.nodes
        && t.packages_per_node == topo.packages_per_node
        && t.dies_per_package == topo.dies_per_package
        && t.measured.as_ref().is_some_and(|m| m.host_key == key);
    Ok(same.then(|| Topology {
        name: topo.name.clone(),
        switch_of_node: topo.switch_of_node.clone(),
        ..t
    }))
}

/// Write `t` as the cache of `key` (a temporary file renamed into place).
fn store(dir: &Path, key: &str, t: &Topology) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::System(e.to_string()))?;
    let path = cache_file(dir, key);
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    t.save(&tmp)?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::System(e.to_string()))
}

impl Comm {
    /// This world with the link figures `links` asks for: itself for `preset`, else a
    /// communicator over the same transport bound to the probed topology (collective).
    pub fn with_links(self, links: LinkSource) -> Result<Comm> {
        if !links.probes() {
            return Ok(self);
        }
        let t = probe(&self, &ProbeOptions::from_env(links)?)?;
        self.rebind(t)
    }

    /// This communicator over the same transport, bound to `topo` (the same layout, other
    /// link figures); this handle's queued work is waited first.
    pub fn rebind(self, topo: Topology) -> Result<Comm> {
        let old = self.topology();
        if (old.nodes, old.packages_per_node, old.dies_per_package)
            != (topo.nodes, topo.packages_per_node, topo.dies_per_package)
        {
            return Err(Error::InvalidUsage(format!(
                "rebind to {} needs the layout of {}",
                topo.summary(),
                old.summary()
            )));
        }
        self.sync()?;
        let (t, cfg) = (self.transport().clone(), self.config().clone());
        Comm::from_transport(t, std::sync::Arc::new(topo), cfg)
    }
}

/// [`Comm::with_links`] for a whole in-process world: every rank probes on its own
/// thread (the probe is collective).
pub fn world_with_links(comms: Vec<Comm>, links: LinkSource) -> Result<Vec<Comm>> {
    if !links.probes() {
        return Ok(comms);
    }
    let handles: Vec<_> = comms
        .into_iter()
        .map(|c| std::thread::spawn(move || c.with_links(links)))
        .collect();
    handles
        .into_iter()
        .map(|h| {
            h.join()
                .unwrap_or_else(|_| Err(Error::Internal("link probe thread panicked".into())))
        })
        .collect()
}
