//! Leaf names shared by every layer: the algorithm names ([`Algo`]), the collective
//! kinds ([`Kind`]) and NCCL's in-place rule ([`Kind::in_place`]). No dependencies
//! beyond the error type, so the selector, the simulator, the checks, the C ABI and the
//! configuration can all name them without importing each other.

#![forbid(unsafe_code)]

use crate::error::{Error, Result};
use std::str::FromStr;

/// `Display` as the type's `name()`: the named kinds of the leaves (algorithms, element
/// types, operators, link classes) print as they parse.
macro_rules! display_as_name {
    ($($t:ty),+) => {$(
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    )+};
}
pub(crate) use display_as_name;

/// An algorithm name (contract: `--algo`, `STRATA_ALGO`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algo {
    /// The flat ring over the whole communicator (the transport's native collective).
    Ring,
    /// MiCS hierarchical all-gather / reduce-scatter over the topology's levels, its
    /// inter-node stage a ring or log-step, whichever the model says is faster.
    Hier,
    /// `hier` with rings at every stage (MiCS as published).
    HierRing,
    /// `hier` with the log-step inter-node stage.
    HierLog,
    /// Log-step (Bruck; recursive doubling / halving for a power-of-two rank count)
    /// all-gather / reduce-scatter over the whole communicator.
    LogStep,
    /// PaRO hierarchical overlapping rings (levels' rings run at once, pipelined).
    HoRing,
    /// ZeRO++ qgZ: quantized 2-hop all-to-all reduce-scatter.
    Qgz,
    /// qgZ's 1-hop variant (one flat quantized all-to-all), for comparison.
    Qgz1,
    /// ZeRO++ qwZ: quantized all-gather.
    Qwz,
    /// Pick by topology and message size ([`crate::algo::select`]).
    Auto,
}

impl Algo {
    /// Every selectable name.
    pub const ALL: [Algo; 10] = {
        use Algo::*;
        [
            Ring, Hier, HierRing, HierLog, LogStep, HoRing, Qgz, Qgz1, Qwz, Auto,
        ]
    };

    /// The lossless algorithms (every one `auto` may pick, the forced forms of `hier`,
    /// and `auto` itself): what every test body and every engine phase takes.
    pub const LOSSLESS: [Algo; 7] = [
        Algo::Ring,
        Algo::LogStep,
        Algo::Hier,
        Algo::HierRing,
        Algo::HierLog,
        Algo::HoRing,
        Algo::Auto,
    ];

    /// Name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::Hier => "hier",
            Algo::HierRing => "hier-ring",
            Algo::HierLog => "hier-log",
            Algo::LogStep => "log-step",
            Algo::HoRing => "ho-ring",
            Algo::Qgz => "qgz",
            Algo::Qgz1 => "qgz-1hop",
            Algo::Qwz => "qwz",
            Algo::Auto => "auto",
        }
    }
}

display_as_name!(Algo);

impl FromStr for Algo {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "ring" | "native" | "flat" => Ok(Algo::Ring),
            "hier" | "hierarchical" | "mics" => Ok(Algo::Hier),
            "hier-ring" => Ok(Algo::HierRing),
            "hier-log" => Ok(Algo::HierLog),
            "log-step" | "log" | "bruck" => Ok(Algo::LogStep),
            "ho-ring" | "horing" | "ho_ring" => Ok(Algo::HoRing),
            "qgz" => Ok(Algo::Qgz),
            "qgz-1hop" | "qgz1" => Ok(Algo::Qgz1),
            "qwz" => Ok(Algo::Qwz),
            "auto" => Ok(Algo::Auto),
            _ => Err(Error::InvalidArgument(format!(
                "unknown algorithm '{s}' (ring, hier, hier-ring, hier-log, log-step, ho-ring, qgz, qgz-1hop, qwz, auto)"
            ))),
        }
    }
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

/// Which collective a check is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    AllGather,
    ReduceScatter,
    AllReduce,
    AllToAll,
    Broadcast { root: usize },
}

impl std::str::FromStr for Kind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Kind> {
        Ok(match s {
            "all-gather" | "allgather" => Kind::AllGather,
            "reduce-scatter" | "reducescatter" => Kind::ReduceScatter,
            "all-reduce" | "allreduce" => Kind::AllReduce,
            "all-to-all" | "alltoall" => Kind::AllToAll,
            "broadcast" => Kind::Broadcast { root: 0 },
            _ => {
                return Err(Error::InvalidArgument(format!(
                "unknown op '{s}' (all-gather, reduce-scatter, all-reduce, all-to-all, broadcast)"
            )))
            }
        })
    }
}

impl Kind {
    /// Name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Kind::AllGather => "all-gather",
            Kind::ReduceScatter => "reduce-scatter",
            Kind::AllReduce => "all-reduce",
            Kind::AllToAll => "all-to-all",
            Kind::Broadcast { .. } => "broadcast",
        }
    }

    /// (send, recv) element counts for `count` (NCCL's per-call count) on `p` ranks.
    pub fn sizes(self, count: usize, p: usize) -> (usize, usize) {
        match self {
            Kind::AllGather => (count, count * p),
            Kind::ReduceScatter => (count * p, count),
            Kind::AllToAll => (count * p, count * p),
            Kind::AllReduce | Kind::Broadcast { .. } => (count, count),
        }
    }
}

/// Which buffer lies inside the other in an in-place call, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InPlace {
    /// `send` is `recv[offset..]` (all-gather: this rank's chunk of the output).
    SendInRecv { offset: usize },
    /// `recv` is `send[offset..]` (reduce-scatter: this rank's chunk of the input).
    RecvInSend { offset: usize },
    /// `send` and `recv` are the same bytes (all-reduce, broadcast on the root).
    Same,
}

impl InPlace {
    /// True when a call whose send buffer starts `send_minus_recv` bytes after its receive
    /// buffer (negative: before) is in place by this rule. Raw pointers (the C ABI) and
    /// buffer views ([`crate::memory::Buffer::offset_in`]) both reduce to this offset.
    pub fn matches(self, send_minus_recv: i128) -> bool {
        match self {
            InPlace::SendInRecv { offset } => send_minus_recv == offset as i128,
            InPlace::RecvInSend { offset } => send_minus_recv == -(offset as i128),
            InPlace::Same => send_minus_recv == 0,
        }
    }
}

impl Kind {
    /// NCCL's in-place layout for this kind on `rank` with `chunk` bytes per rank: the
    /// one rule the request checks, the native execution and the C ABI share. All-gather
    /// is in place when `send == recv + rank·chunk`, reduce-scatter when `recv == send +
    /// rank·chunk`, all-reduce and broadcast when `send == recv`; all-to-all never is.
    pub fn in_place(self, rank: usize, chunk: usize) -> Option<InPlace> {
        match self {
            Kind::AllGather => Some(InPlace::SendInRecv {
                offset: rank * chunk,
            }),
            Kind::ReduceScatter => Some(InPlace::RecvInSend {
                offset: rank * chunk,
            }),
            Kind::AllReduce | Kind::Broadcast { .. } => Some(InPlace::Same),
            Kind::AllToAll => None,
        }
    }
}
