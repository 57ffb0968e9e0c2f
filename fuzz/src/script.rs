//! A call script: the decoding of a byte stream (libFuzzer's input, or seeded PRNG
//! bytes) into worlds, the steps their ranks take, and how each world ends. Decoding
//! never fails: an exhausted stream reads as zeros (the smallest choices).

use crate::bad::{Bad, COLLS};
use crate::coll::{Coll, Kind};
use crate::data::{DTYPES, OPS, QUANT_FLOATS};
use arbitrary::Unstructured;
use std::ffi::c_int;
use strata::capi::*;

pub struct Dec<'a>(pub Unstructured<'a>);

impl Dec<'_> {
    pub fn int(&mut self, lo: usize, hi: usize) -> usize {
        self.0.int_in_range(lo..=hi).unwrap_or(lo)
    }
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.int(0, xs.len() - 1)]
    }
    /// True with probability about `num / den`.
    pub fn chance(&mut self, num: usize, den: usize) -> bool {
        self.int(0, den - 1) < num
    }
    pub fn seed(&mut self) -> u64 {
        self.0.arbitrary().unwrap_or(0)
    }
    pub fn done(&self) -> bool {
        self.0.is_empty()
    }
}

/// How a world's communicators are made.
#[derive(Clone, Debug)]
pub enum Init {
    /// `strataCommInitLocal` on the coordinator (NULL config, or one with `algo`).
    Local { config: bool },
    /// `strataGetUniqueId`, then `strataCommInitRank[Config]` on every rank thread.
    Rank { config: bool },
}

/// How calls of a valid step are wrapped.
#[derive(Clone, Copy, Debug)]
pub enum Wrap {
    Plain,
    Group,
    Nested,
}

#[derive(Clone, Debug)]
pub enum Step {
    Coll(Coll, Wrap),
    /// Several collectives in one group per rank, a bad call between them.
    Multi(Vec<Coll>, Vec<Bad>, bool),
    /// Rank 0's thread drives every rank's communicator in one group.
    DriveAll(Coll),
    /// Every rank makes its own bad calls.
    Bad(Vec<Vec<Bad>>),
    /// Colors (`-1`: no color) and keys of a split, then an all-reduce on the parts.
    Split(Vec<c_int>, Vec<c_int>, bool, u64),
    /// A side world of `n` ranks made and driven (one group) by rank 0's thread.
    Side(usize, Coll),
}

#[derive(Clone, Debug)]
pub enum End {
    Destroy,
    Abort,
    /// The coordinator aborts rank `victim`'s communicator after `delay_us` while every
    /// rank runs the all-reduce.
    AbortDuring(usize, u64, Coll),
    /// Rank `victim` destroys its communicator while the others run the all-reduce.
    DestroyDuring(usize, Coll),
    /// Every rank groups a collective, destroys its communicator, ends the group.
    GroupDestroy(Coll),
    /// Ranks in the mask group a collective and never end the group; all destroy.
    Abandon(u32, Coll),
}

#[derive(Clone, Debug)]
pub struct World {
    pub n: usize,
    pub topology: Option<String>,
    pub algo: Option<&'static str>,
    pub init: Init,
    pub timeout_ms: u64,
    pub steps: Vec<Step>,
    pub end: End,
}

fn count(d: &mut Dec) -> usize {
    match d.int(0, 19) {
        0 | 1 => 0,
        2..=13 => d.int(1, 17),
        14..=18 => d.int(18, 1500),
        _ => d.int(1501, 20000),
    }
}

pub fn coll(d: &mut Dec, n: usize, p2p: bool) -> Coll {
    let k = d.int(0, if p2p { 10 } else { 9 });
    let mut dt = d.pick(&DTYPES);
    let mut op = d.pick(&OPS);
    let block = |d: &mut Dec| d.pick(&[2usize, 4, 8, 16, 32, 64, 256]);
    let kind = match k {
        0 => Kind::AllGather,
        1 => Kind::ReduceScatter,
        2 | 3 => Kind::AllReduce,
        4 => Kind::AllToAll,
        5 => Kind::Broadcast {
            root: d.int(0, n - 1),
            null_send: d.chance(1, 2),
        },
        6 => Kind::Bcast {
            root: d.int(0, n - 1),
        },
        7 => {
            dt = d.pick(&QUANT_FLOATS);
            Kind::AllGatherQ {
                bits: d.pick(&[4, 8]),
                block: block(d),
            }
        }
        8 => {
            dt = d.pick(&QUANT_FLOATS);
            op = d.pick(&[strataSum, strataAvg]);
            Kind::ReduceScatterQ {
                bits: d.pick(&[4, 8]),
                block: block(d),
            }
        }
        9 => {
            let m = d.int(0, 4);
            let counts = (0..m).map(|_| count(d).min(3000)).collect();
            if d.chance(1, 2) {
                Kind::AgCoalesced(counts)
            } else {
                Kind::RsCoalesced(counts)
            }
        }
        _ => Kind::SendRecv { shift: d.int(0, n) },
    };
    Coll {
        kind,
        dt,
        op,
        count: count(d),
        in_place: d.chance(1, 2),
        misalign: d.int(0, 3),
        seed: d.seed(),
    }
}

/// A bad call; `grouped`: one that may be made inside a group.
pub fn bad(d: &mut Dec, grouped: bool) -> Bad {
    let w = d.int(0, COLLS - 1);
    let v = d.int(0, 1 << 16);
    let top = if grouped { 12 } else { 23 };
    match d.int(0, top) {
        0 => Bad::NullComm(w),
        1 => Bad::Foreign(w, v),
        2 => Bad::Dead(w, v),
        3 => Bad::Dtype(
            w,
            d.pick(&[10, 11, 12, 42, -1, c_int::MIN, c_int::MAX, 255]),
        ),
        4 => Bad::Op(w, d.pick(&[5, 6, -1, 99, c_int::MAX, c_int::MIN])),
        5 => Bad::Root(d.chance(1, 2), root_bad(d)),
        6 => Bad::Peer(d.chance(1, 2), root_bad(d)),
        7 => Bad::NullBuf(w, d.chance(1, 2)),
        8 => Bad::Overflow(w, v),
        9 => Bad::WrapPtr(w),
        10 => Bad::Overlap(v),
        11 => Bad::CoalescedOverlap(d.chance(1, 2)),
        12 => Bad::Quant(v, w),
        13 => Bad::CoalescedArrays(d.chance(1, 2), v),
        14 => Bad::GroupEndAlone,
        15 => Bad::InGroup(Box::new(bad(d, true)), d.chance(1, 2)),
        16 => Bad::Query(v, d.chance(1, 2)),
        17 => Bad::Version(d.chance(1, 2)),
        18 => Bad::Strings(d.pick(&[0, 3, 6, 7, 8, -1, 1000]), v),
        19 => Bad::Split(v),
        20 => Bad::Release(d.chance(1, 2), v),
        21 => Bad::UniqueId(v),
        22 => Bad::InitRank(v),
        _ => Bad::InitLocal(v),
    }
}

fn root_bad(d: &mut Dec) -> c_int {
    // Resolved against the world's size at run time: -1, n, n + k, extremes.
    d.pick(&[-1, -2, c_int::MIN, c_int::MAX, 1 << 20, 64])
}

fn topology(d: &mut Dec, n: usize) -> Option<String> {
    let divs: Vec<usize> = (1..=n).filter(|a| n % a == 0).collect();
    match d.int(0, 3) {
        0 => None,
        _ => {
            let a = d.pick(&divs);
            Some(format!("nodes:{a}x{}", n / a))
        }
    }
}

/// The next world of the script, with at most `max_steps` steps on `1..=max_n` ranks.
pub fn world(d: &mut Dec, max_n: usize, max_steps: usize, timeout_ms: u64) -> World {
    let n = d.int(1, max_n);
    let topology = topology(d, n);
    let algo = d.pick(&[None, Some("ring"), Some("hier"), Some("auto")]);
    let init = if d.chance(1, 2) {
        Init::Local {
            config: d.chance(1, 2),
        }
    } else {
        Init::Rank {
            config: d.chance(3, 4),
        }
    };
    let nsteps = d.int(0, max_steps);
    let mut steps = Vec::with_capacity(nsteps);
    for _ in 0..nsteps {
        let s = match d.int(0, 15) {
            0..=4 => {
                let c = coll(d, n, true);
                Step::Coll(
                    c,
                    d.pick(&[Wrap::Plain, Wrap::Plain, Wrap::Group, Wrap::Nested]),
                )
            }
            5 | 6 => {
                let k = d.int(1, 3);
                let cs = (0..k).map(|_| coll(d, n, true)).collect();
                let bads = (0..n).map(|_| bad(d, true)).collect();
                Step::Multi(cs, bads, d.chance(1, 2))
            }
            7 => Step::DriveAll(coll(d, n, true)),
            8..=12 => Step::Bad(
                (0..n)
                    .map(|_| (0..d.int(1, 4)).map(|_| bad(d, false)).collect())
                    .collect(),
            ),
            13 | 14 => {
                let colors = (0..n).map(|_| d.int(0, 3) as c_int - 1).collect();
                let keys = (0..n).map(|_| d.int(0, 4) as c_int - 2).collect();
                Step::Split(colors, keys, d.chance(1, 2), d.seed())
            }
            _ => {
                let m = d.int(1, 4);
                Step::Side(m, coll(d, m, true))
            }
        };
        steps.push(s);
    }
    let reduce = |d: &mut Dec| Coll {
        kind: Kind::AllReduce,
        dt: strataFloat32,
        op: strataSum,
        count: d.int(1, 64),
        in_place: false,
        misalign: 0,
        seed: d.seed(),
    };
    let mut timeout_ms = timeout_ms;
    let end = match d.int(0, 63) {
        0..=29 => End::Destroy,
        30..=39 => End::Abort,
        40..=51 => End::AbortDuring(d.int(0, n - 1), d.int(0, 3000) as u64, reduce(d)),
        52 | 53 => {
            // Its peers wait for the timeout: keep it short.
            timeout_ms = (timeout_ms / 4).max(100);
            End::DestroyDuring(d.int(0, n - 1), reduce(d))
        }
        54..=58 => End::GroupDestroy(reduce(d)),
        _ => End::Abandon(d.int(0, 255) as u32, reduce(d)),
    };
    World {
        n,
        topology,
        algo,
        init,
        timeout_ms,
        steps,
        end,
    }
}
