//! Algorithms: one file per technique. Each declares the constraints it needs and is
//! written once against the communicator API, so it runs unchanged on every transport;
//! when its constraints do not hold the request falls back to the native collective.
//!
//! - [`ring`]: flat baselines (the native collectives of host transports);
//! - [`hierarchical`]: MiCS §3.3 hierarchical all-gather / reduce-scatter, 2 and 3 levels;
//! - [`ho_ring`]: PaRO §3.3 hierarchical overlapping rings, and the pipelined 2-D all-reduce;
//! - [`plan`]: algorithms as per-rank step lists, executed or turned into schedules;
//! - [`qgz`], [`qwz`]: ZeRO++ quantized reduce-scatter (2-hop and 1-hop) and all-gather;
//! - [`coalesced`]: MiCS §4 coalesced all-gather / reduce-scatter over uneven buffers;
//! - [`select`]: the `auto` rule.

pub mod coalesced;
pub mod hierarchical;
pub mod ho_ring;
pub mod plan;
pub mod qgz;
pub mod qwz;
pub mod ring;
pub mod select;

use crate::comm::request::{Op, Request};
use crate::comm::Comm;
use crate::error::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// An algorithm name (contract: `--algo`, `STRATA_ALGO`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algo {
    /// The flat ring over the whole communicator (the transport's native collective).
    Ring,
    /// MiCS hierarchical all-gather / reduce-scatter over the topology's levels.
    Hier,
    /// PaRO hierarchical overlapping rings (levels' rings run at once, pipelined).
    HoRing,
    /// ZeRO++ qgZ: quantized 2-hop all-to-all reduce-scatter.
    Qgz,
    /// qgZ's 1-hop variant (one flat quantized all-to-all), for comparison.
    Qgz1,
    /// ZeRO++ qwZ: quantized all-gather.
    Qwz,
    /// Pick by topology and message size ([`select`]).
    Auto,
}

impl Algo {
    /// Every selectable name.
    pub const ALL: [Algo; 7] = [
        Algo::Ring,
        Algo::Hier,
        Algo::HoRing,
        Algo::Qgz,
        Algo::Qgz1,
        Algo::Qwz,
        Algo::Auto,
    ];

    /// Name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::Hier => "hier",
            Algo::HoRing => "ho-ring",
            Algo::Qgz => "qgz",
            Algo::Qgz1 => "qgz-1hop",
            Algo::Qwz => "qwz",
            Algo::Auto => "auto",
        }
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algo {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "ring" | "native" | "flat" => Ok(Algo::Ring),
            "hier" | "hierarchical" | "mics" => Ok(Algo::Hier),
            "ho-ring" | "horing" | "ho_ring" => Ok(Algo::HoRing),
            "qgz" => Ok(Algo::Qgz),
            "qgz-1hop" | "qgz1" => Ok(Algo::Qgz1),
            "qwz" => Ok(Algo::Qwz),
            "auto" => Ok(Algo::Auto),
            _ => Err(Error::InvalidArgument(format!(
                "unknown algorithm '{s}' (ring, hier, ho-ring, qgz, qgz-1hop, qwz, auto)"
            ))),
        }
    }
}

/// A registered algorithm.
pub trait Algorithm: Sync {
    /// Its name.
    fn algo(&self) -> Algo;
    /// `None` when it can run `req` on `comm`, else why not.
    fn unsupported(&self, comm: &Comm, req: &Request) -> Option<String>;
    /// Run a checked, non-coalesced request (on the communicator's stream thread).
    /// Reductions with `Avg` leave the sum: the submit path divides once.
    fn run(&self, comm: &Comm, req: &Request) -> Result<()>;
    /// True when `run` already divides `Avg` results by the communicator size.
    fn divides_avg(&self) -> bool {
        false
    }
}

/// The ring / native baseline.
pub struct Native;

impl Algorithm for Native {
    fn algo(&self) -> Algo {
        Algo::Ring
    }
    fn unsupported(&self, _: &Comm, _: &Request) -> Option<String> {
        None
    }
    fn run(&self, comm: &Comm, req: &Request) -> Result<()> {
        crate::comm::native::run(
            comm.transport().as_ref(),
            &req.op,
            req.dtype,
            comm.timeout(),
        )
    }
}

/// Run a checked request: coalesced requests are packed and run as one flat request;
/// the algorithm is the one [`select::choose`] returns.
/// Returns whether the algorithm already divided an `Avg` result (quantized algorithms
/// divide inside their final f32 reduction, before rounding to the output type).
pub fn execute(comm: &Comm, req: &Request) -> Result<bool> {
    match &req.op {
        Op::AllGatherCoalesced { .. } | Op::ReduceScatterCoalesced { .. } => {
            coalesced::run(comm, req, |flat| run_flat(comm, flat))
        }
        _ => run_flat(comm, req),
    }
}

fn run_flat(comm: &Comm, req: &Request) -> Result<bool> {
    let (a, why) = select::choose(comm, req);
    tracing::debug!(rank = comm.rank(), op = req.op.name(), algo = a.algo().name(), reason = %why, "dispatch");
    a.run(comm, req)?;
    Ok(a.divides_avg())
}

impl serde::Serialize for Algo {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for Algo {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}
