//! Valid collectives: one rank's buffers and calls for a [`Coll`] ([`Prep`]), and the
//! check of its results against the reference ([`Prep::check`]).

use crate::data::{compare, size, Values};
use crate::ffi::{Call, H};
use std::ffi::{c_int, c_void};
use std::ptr::{null, null_mut};

#[derive(Clone, Debug)]
pub enum Kind {
    AllGather,
    AllGatherQ {
        bits: c_int,
        block: usize,
    },
    ReduceScatter,
    ReduceScatterQ {
        bits: c_int,
        block: usize,
    },
    AllReduce,
    AllToAll,
    Broadcast {
        root: usize,
        null_send: bool,
    },
    Bcast {
        root: usize,
    },
    /// Send to `rank + shift`, receive from `rank - shift` (as two calls).
    SendRecv {
        shift: usize,
    },
    AgCoalesced(Vec<usize>),
    RsCoalesced(Vec<usize>),
}

/// One valid collective, the same on every rank.
#[derive(Clone, Debug)]
pub struct Coll {
    pub kind: Kind,
    pub dt: c_int,
    pub op: c_int,
    pub count: usize,
    pub in_place: bool,
    /// Bytes by which every buffer is misaligned (0..4).
    pub misalign: usize,
    pub seed: u64,
}

const GARBAGE: u8 = 0xA5;

/// A buffer at `misalign` bytes into its allocation, with a spare element after it.
pub struct Region {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

impl Region {
    pub fn new(len: usize, misalign: usize, spare: usize) -> Region {
        Region {
            v: vec![GARBAGE; len + misalign + spare],
            off: misalign,
            len,
        }
    }
    pub fn bytes(&self) -> &[u8] {
        &self.v[self.off..self.off + self.len]
    }
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let (o, l) = (self.off, self.len);
        &mut self.v[o..o + l]
    }
    /// The address `at` bytes into the buffer (stable: the vector never grows).
    pub fn ptr(&mut self, at: usize) -> *mut c_void {
        self.v[self.off..].as_mut_ptr().wrapping_add(at) as *mut c_void
    }
}

struct Entry {
    send: Region,
    recv: Region,
    in_place: bool,
    count: usize,
    base: usize,
}

impl Entry {
    fn new(send: Region, recv: Region, in_place: bool, count: usize, base: usize) -> Entry {
        Entry {
            send,
            recv,
            in_place,
            count,
            base,
        }
    }
}

/// One rank's share of a [`Coll`]: buffers (owned here, so the calls' pointers stay
/// valid while this lives) and the calls to make.
pub struct Prep {
    coll: Coll,
    rank: usize,
    n: usize,
    entries: Vec<Entry>,
    sp: Vec<*const c_void>,
    rp: Vec<*mut c_void>,
    counts: Vec<usize>,
    pub calls: Vec<Call>,
}

impl Coll {
    fn values(&self) -> Values {
        let quant = matches!(
            self.kind,
            Kind::AllGatherQ { .. } | Kind::ReduceScatterQ { .. }
        );
        Values {
            seed: self.seed,
            dt: self.dt,
            op: self.op,
            quant,
        }
    }

    /// Rank `rank`'s buffers and calls on communicator `h` of a world of `n`.
    pub fn prepare(&self, h: H, rank: usize, n: usize) -> Prep {
        let s = size(self.dt);
        let (c, m) = (self.count, self.misalign);
        let v = self.values();
        let mut p = Prep {
            coll: self.clone(),
            rank,
            n,
            entries: Vec::new(),
            sp: Vec::new(),
            rp: Vec::new(),
            counts: Vec::new(),
            calls: Vec::new(),
        };
        let (dt, op) = (self.dt, self.op);
        // An entry of `count` elements per rank: gather-like (send c, recv n*c; in place
        // send is slot `rank` of recv) or scatter-like (send n*c, recv c; in place recv is
        // block `rank` of send). This rank's input is filled where the call reads it.
        let entry = |count: usize, base: usize, in_place: bool, gather_like: bool| {
            let whole = Region::new(n * count * s, m, s);
            let one = Region::new(if in_place { 0 } else { count * s }, m, 0);
            let (mut send, mut recv) = if gather_like {
                (one, whole)
            } else {
                (whole, one)
            };
            if gather_like && in_place {
                let slot = &mut recv.bytes_mut()[rank * count * s..(rank + 1) * count * s];
                v.fill(slot, rank, base);
            } else {
                v.fill(send.bytes_mut(), rank, base);
            }
            Entry::new(send, recv, in_place, count, base)
        };
        let ptrs = |e: &mut Entry, gather_like: bool| -> (*const c_void, *mut c_void) {
            let chunk = rank * e.count * s;
            match (e.in_place, gather_like) {
                (true, true) => {
                    let r = e.recv.ptr(0);
                    (e.recv.ptr(chunk) as *const c_void, r)
                }
                (true, false) => (e.send.ptr(0) as *const c_void, e.send.ptr(chunk)),
                _ => (e.send.ptr(0) as *const c_void, e.recv.ptr(0)),
            }
        };
        match &self.kind {
            Kind::AllGather | Kind::AllGatherQ { .. } => {
                let mut e = entry(c, 0, self.in_place, true);
                let (a, b) = ptrs(&mut e, true);
                p.calls.push(match self.kind {
                    Kind::AllGatherQ { bits, block } => {
                        Call::AllGatherQ(a, b, c, dt, bits, block, h)
                    }
                    _ => Call::AllGather(a, b, c, dt, h),
                });
                p.entries.push(e);
            }
            Kind::ReduceScatter | Kind::ReduceScatterQ { .. } => {
                let mut e = entry(c, 0, self.in_place, false);
                let (a, b) = ptrs(&mut e, false);
                p.calls.push(match self.kind {
                    Kind::ReduceScatterQ { bits, block } => {
                        Call::ReduceScatterQ(a, b, c, dt, op, bits, block, h)
                    }
                    _ => Call::ReduceScatter(a, b, c, dt, op, h),
                });
                p.entries.push(e);
            }
            Kind::AllReduce | Kind::AllToAll => {
                let len = if matches!(self.kind, Kind::AllToAll) {
                    n * c
                } else {
                    c
                };
                let mut send = Region::new(len * s, m, 0);
                v.fill(send.bytes_mut(), rank, 0);
                let in_place = self.in_place && matches!(self.kind, Kind::AllReduce);
                let mut recv = Region::new(if in_place { 0 } else { len * s }, m, 0);
                let a = send.ptr(0) as *const c_void;
                let b = if in_place { send.ptr(0) } else { recv.ptr(0) };
                p.calls.push(match self.kind {
                    Kind::AllToAll => Call::AllToAll(a, b, c, dt, h),
                    _ => Call::AllReduce(a, b, c, dt, op, h),
                });
                p.entries.push(Entry::new(send, recv, in_place, c, 0));
            }
            Kind::Broadcast { root, null_send } => {
                let me = rank == *root;
                let in_place = me && self.in_place;
                let mut recv = Region::new(c * s, m, 0);
                let mut send = Region::new(if in_place { 0 } else { c * s }, m, 0);
                if in_place {
                    v.fill(recv.bytes_mut(), rank, 0);
                } else {
                    v.fill(send.bytes_mut(), rank, 0);
                }
                let a = match (in_place, me || !null_send) {
                    (true, _) => recv.ptr(0) as *const c_void,
                    (false, true) => send.ptr(0) as *const c_void,
                    (false, false) => null(),
                };
                p.calls
                    .push(Call::Broadcast(a, recv.ptr(0), c, dt, *root as c_int, h));
                p.entries.push(Entry::new(send, recv, in_place, c, 0));
            }
            Kind::Bcast { root } => {
                let mut recv = Region::new(c * s, m, 0);
                if rank == *root {
                    v.fill(recv.bytes_mut(), rank, 0);
                }
                p.calls
                    .push(Call::Bcast(recv.ptr(0), c, dt, *root as c_int, h));
                let send = Region::new(0, m, 0);
                p.entries.push(Entry::new(send, recv, true, c, 0));
            }
            Kind::SendRecv { shift } => {
                let mut send = Region::new(c * s, m, 0);
                v.fill(send.bytes_mut(), rank, 0);
                let mut recv = Region::new(c * s, m, 0);
                let (to, from) = ((rank + shift) % n, (rank + n - shift % n) % n);
                p.calls.push(Call::Send(send.ptr(0), c, dt, to as c_int, h));
                p.calls
                    .push(Call::Recv(recv.ptr(0), c, dt, from as c_int, h));
                p.entries.push(Entry::new(send, recv, false, c, from));
            }
            Kind::AgCoalesced(counts) | Kind::RsCoalesced(counts) => {
                let gathering = matches!(self.kind, Kind::AgCoalesced(_));
                for (i, &ci) in counts.iter().enumerate() {
                    let ip = self.in_place && (self.seed >> i) & 1 == 1;
                    let mut e = entry(ci, i * 1_000_000, ip, gathering);
                    let (a, b) = ptrs(&mut e, gathering);
                    // Empty entries may be NULL.
                    let null_ok = ci == 0 && (self.seed >> (i + 8)) & 1 == 1;
                    p.sp.push(if null_ok { null() } else { a });
                    p.rp.push(if null_ok { null_mut() } else { b });
                    p.counts.push(ci);
                    p.entries.push(e);
                }
                let (a, b, k, nb) = (
                    p.sp.as_ptr(),
                    p.rp.as_ptr(),
                    p.counts.as_ptr(),
                    counts.len(),
                );
                p.calls.push(if gathering {
                    Call::AgCoalesced(a, b, k, nb, dt, h)
                } else {
                    Call::RsCoalesced(a, b, k, nb, dt, op, h)
                });
            }
        }
        p
    }
}

impl Prep {
    /// Compare this rank's results with the reference.
    pub fn check(&self) -> Result<(), String> {
        let (n, r) = (self.n, self.rank);
        let v = self.coll.values();
        let s = size(self.coll.dt);
        let bits = match self.coll.kind {
            Kind::AllGatherQ { bits, .. } | Kind::ReduceScatterQ { bits, .. } => bits,
            _ => 0,
        };
        let gather_tol = |w: f64| v.tolerance(n, bits, false, w);
        let reduce_tol = |w: f64| v.tolerance(n, bits, true, w);
        for (i, e) in self.entries.iter().enumerate() {
            let c = e.count;
            let res = match &self.coll.kind {
                Kind::AllGather | Kind::AllGatherQ { .. } | Kind::AgCoalesced(_) => compare(
                    v.dt,
                    e.recv.bytes(),
                    |k| v.at(k / c.max(1), e.base + k % c.max(1)),
                    gather_tol,
                ),
                Kind::ReduceScatter | Kind::ReduceScatterQ { .. } | Kind::RsCoalesced(_) => {
                    let out = if e.in_place {
                        &e.send.bytes()[r * c * s..(r + 1) * c * s]
                    } else {
                        e.recv.bytes()
                    };
                    compare(v.dt, out, |k| v.reduced(n, e.base + r * c + k), reduce_tol)
                }
                Kind::AllReduce => {
                    let out = if e.in_place {
                        e.send.bytes()
                    } else {
                        e.recv.bytes()
                    };
                    compare(v.dt, out, |k| v.reduced(n, k), reduce_tol)
                }
                Kind::AllToAll => compare(
                    v.dt,
                    e.recv.bytes(),
                    |k| v.at(k / c.max(1), r * c + k % c.max(1)),
                    gather_tol,
                ),
                Kind::Broadcast { root, .. } | Kind::Bcast { root } => {
                    compare(v.dt, e.recv.bytes(), |k| v.at(*root, k), gather_tol)
                }
                Kind::SendRecv { .. } => {
                    compare(v.dt, e.recv.bytes(), |k| v.at(e.base, k), gather_tol)
                }
            };
            res.map_err(|m| format!("{:?} rank {r}/{n} entry {i}: {m}", self.coll))?;
        }
        Ok(())
    }
}
