//! Schedules: a collective as a dependency graph of transfers.
//!
//! A [`Schedule`] is every point-to-point transfer one call of a collective makes
//! (sender, receiver, bytes, link class) and, per transfer, the transfers that must
//! complete before it may start. Three ways to get one:
//!
//! - [`Schedule::from_plans`]: from the per-rank [`Plan`]s of [`crate::algo::plan`]
//!   (what `ring`, `hier` and `ho-ring` execute). Each plan step is one sendrecv on its
//!   ring's stream: the transfer `rank -> dst` of the step's send span, and a receive
//!   from `src`, matched to that peer's transfer on the same ring in FIFO order per
//!   (ring, src, dst) (the order of the transports' mailboxes). A step completes when
//!   both its transfer and its matched receive have completed; a transfer waits for the
//!   previous step on the same (rank, ring) stream and for every explicit dependency
//!   step of the plan (`Step::deps`, the cross-communicator `Request::after`).
//! - [`dry_run`]: builds every rank's plan of one collective on a whole topology and
//!   turns them into a schedule, without buffers or threads (1024 ranks in well under
//!   a second per schedule in release builds).
//! - [`Schedule::from_recording`]: from the event log of a real run on the local
//!   transport ([`start_recording`] / [`finish_recording`], or
//!   [`crate::traffic::Traffic::start_recording`] directly).
//!
//! Dependencies are stored compactly (a flat `u32` list with offsets), so millions of
//! transfers cost tens of bytes each.

use crate::algo::plan::{self, Plan, Ring};
use crate::algo::{ho_ring, log_step, select, Algo};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::kinds::Kind;
use crate::topology::Hierarchy;
use crate::topology::{channels, LinkClass, Topology};
use crate::traffic::Traffic;
use crate::traffic::{Event, EventKind, TrafficReport};
use crate::transport::TransportKind;
use std::collections::{HashMap, VecDeque};

/// One collective call on a whole topology, as the simulator takes it: `kind` with
/// NCCL's per-call `count` of `dtype` elements (all-gather: per-rank send count;
/// reduce-scatter: per-rank receive count; all-reduce: the count) under `algo` on every
/// rank of `topo`. `chunks`: pieces per chunk for `ho-ring` (default
/// [`plan::default_chunks`], as when executed).
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    pub topo: &'a Topology,
    pub kind: Kind,
    pub algo: Algo,
    pub count: usize,
    pub dtype: DataType,
    pub chunks: Option<usize>,
}

impl<'a> Call<'a> {
    /// `kind` with `count` elements of `dtype` under `algo` on `topo`, with the default
    /// pieces per chunk (`chunks: None`).
    pub fn new(topo: &'a Topology, kind: Kind, algo: Algo, count: usize, dtype: DataType) -> Self {
        Call {
            topo,
            kind,
            algo,
            count,
            dtype,
            chunks: None,
        }
    }

    /// Pieces per chunk of `ho-ring` over `elems` elements: `chunks`, or the default.
    fn pieces(&self, elems: usize) -> usize {
        self.chunks
            .unwrap_or_else(|| plan::default_chunks(elems * self.dtype.size()))
            .max(1)
    }
}

/// One transfer: `bytes` from world rank `src` to world rank `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    pub src: u32,
    pub dst: u32,
    pub bytes: u64,
    /// Link class between `src` and `dst` in the schedule's topology.
    pub class: LinkClass,
    /// The sender's rank in the communicator the schedule describes (plans: the comm
    /// rank whose plan holds the step; recordings: the sender's world rank).
    pub rank: u32,
    /// The sender's step: its plan step index (plans), or the number of sends it made
    /// before on the same communicator (recordings).
    pub step: u32,
    /// Index into [`Schedule::rings`]: the ring (plans: hierarchy level or `flat`) or the
    /// communicator (recordings) the transfer ran on.
    pub ring: u32,
}

/// A collective as a dependency graph of transfers (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// World size of the topology the schedule was built for.
    pub ranks: usize,
    /// The transfers; from plans ordered step-major (every rank's step 0, then step 1,
    /// ...), from recordings in send order.
    pub transfers: Vec<Transfer>,
    /// Names of the ring labels ([`Transfer::ring`]): `network`, `node`, `package`, `flat`
    /// for plans; `group<id>` for recordings.
    pub rings: Vec<String>,
    /// The algorithm the plans came from (`auto` resolved); `None` for recordings.
    pub algo: Option<Algo>,
    /// Pieces per chunk of a dry-run `ho-ring` schedule (the `chunks` argument or the
    /// default [`plan::default_chunks`]); `None` otherwise.
    pub pieces: Option<usize>,
    /// `dep_start[i]..dep_start[i+1]` indexes `dep_list` for transfer i.
    dep_start: Vec<u32>,
    dep_list: Vec<u32>,
}

impl Schedule {
    fn empty(ranks: usize) -> Schedule {
        Schedule {
            ranks,
            transfers: Vec::new(),
            rings: Vec::new(),
            algo: None,
            pieces: None,
            dep_start: vec![0],
            dep_list: Vec::new(),
        }
    }

    /// Number of transfers.
    pub fn len(&self) -> usize {
        self.transfers.len()
    }

    /// True when there is no transfer (one rank, or a collective that moves nothing).
    pub fn is_empty(&self) -> bool {
        self.transfers.is_empty()
    }

    /// The transfers that must complete before transfer `i` may start.
    pub fn deps(&self, i: usize) -> &[u32] {
        &self.dep_list[self.dep_start[i] as usize..self.dep_start[i + 1] as usize]
    }

    /// Total number of dependency edges.
    pub fn num_deps(&self) -> usize {
        self.dep_list.len()
    }

    /// Name of transfer `i`'s ring label.
    pub fn ring_name(&self, i: usize) -> &str {
        self.rings
            .get(self.transfers[i].ring as usize)
            .map(String::as_str)
            .unwrap_or("?")
    }

    /// Bytes per link class, in [`LinkClass::index`] order.
    pub fn class_bytes(&self) -> [u64; 3] {
        let mut b = [0u64; 3];
        for t in &self.transfers {
            b[t.class.index()] += t.bytes;
        }
        b
    }

    /// The traffic figures strata-perf reports (bytes per class, largest node egress),
    /// computed from the transfers on `topo` (the topology the schedule was built for).
    pub fn traffic(&self, topo: &Topology) -> TrafficReport {
        let mut r = TrafficReport::default();
        let mut egress = vec![0u64; topo.nodes];
        for t in &self.transfers {
            match t.class {
                LinkClass::IntraPackage => r.intra_package += t.bytes,
                LinkClass::IntraNode => r.intra_node += t.bytes,
                LinkClass::InterNode => {
                    r.inter_node += t.bytes;
                    if let Some(e) = egress.get_mut(topo.node_of(t.src as usize)) {
                        *e += t.bytes;
                    }
                }
            }
        }
        r.max_node_egress = egress.into_iter().max().unwrap_or(0);
        r
    }

    /// The reverse graph in CSR form: `(start, list)`, the dependents of transfer i are
    /// `list[start[i]..start[i+1]]`.
    pub fn dependents(&self) -> (Vec<u32>, Vec<u32>) {
        let n = self.transfers.len();
        let mut start = vec![0u32; n + 1];
        for &d in &self.dep_list {
            start[d as usize + 1] += 1;
        }
        for i in 0..n {
            start[i + 1] += start[i];
        }
        let mut fill = start.clone();
        let mut list = vec![0u32; self.dep_list.len()];
        for i in 0..n {
            for &d in self.deps(i) {
                let f = &mut fill[d as usize];
                list[*f as usize] = i as u32;
                *f += 1;
            }
        }
        (start, list)
    }

    /// Err(InvalidUsage) naming a transfer on a dependency cycle (a deadlock) when there
    /// is one.
    pub fn check_acyclic(&self) -> Result<()> {
        let n = self.transfers.len();
        // Fast path: every dependency points to an earlier transfer (the usual case of
        // step-major plans and of recordings) is a topological order already.
        if (0..n).all(|i| self.deps(i).iter().all(|&d| (d as usize) < i)) {
            return Ok(());
        }
        let (start, list) = self.dependents();
        let mut indeg: Vec<u32> = (0..n)
            .map(|i| self.dep_start[i + 1] - self.dep_start[i])
            .collect();
        let mut stack: Vec<u32> = (0..n as u32).filter(|&i| indeg[i as usize] == 0).collect();
        let mut seen = 0usize;
        while let Some(i) = stack.pop() {
            seen += 1;
            for &d in &list[start[i as usize] as usize..start[i as usize + 1] as usize] {
                indeg[d as usize] -= 1;
                if indeg[d as usize] == 0 {
                    stack.push(d);
                }
            }
        }
        if seen == n {
            return Ok(());
        }
        let stuck = (0..n).find(|&i| indeg[i] > 0).unwrap_or(0);
        let t = &self.transfers[stuck];
        Err(Error::InvalidUsage(format!(
            "deadlock: {} of {n} transfers wait on a dependency cycle, e.g. rank {} step {} \
             ({} -> {}, ring {})",
            n - seen,
            t.rank,
            t.step,
            t.src,
            t.dst,
            self.ring_name(stuck)
        )))
    }

    /// The schedule of `plans` (one per communicator rank) on `topo`: `members[r]` is the
    /// world rank of comm rank r, `h` the communicator's hierarchy (needed when a plan
    /// has `Ring::Level` steps). Err(InvalidUsage) on an unmatched receive or send, a
    /// size mismatch between a send and its receive, or a dependency cycle.
    pub fn from_plans(
        topo: &Topology,
        h: Option<&Hierarchy>,
        members: &[usize],
        plans: &[Plan],
    ) -> Result<Schedule> {
        if plans.len() != members.len() {
            return Err(Error::InvalidArgument(format!(
                "{} plans for {} members",
                plans.len(),
                members.len()
            )));
        }
        let mut b = Builder::new(topo, h, members)?;
        for (r, p) in plans.iter().enumerate() {
            b.add(r, p)?;
        }
        b.finish()
    }

    /// The schedule of a recorded run: `events` as returned by
    /// [`crate::traffic::Traffic::take_recording`] on `topo` (world ranks). Every send is
    /// a transfer; a receive is matched to the sends of its (communicator, src, dst) in
    /// FIFO order. A transfer waits for, in the sender's program order (`seq`): its
    /// previous send on the same communicator, the transfer its last completed receive
    /// on that communicator matched, and the last receive it completed on any other
    /// communicator before the send (how cross-communicator dependencies show in a
    /// recording: observed order, so possibly stricter than the algorithm needs).
    pub fn from_recording(topo: &Topology, events: &[Event]) -> Result<Schedule> {
        let n = topo.world_size();
        let mut ev: Vec<&Event> = events.iter().collect();
        ev.sort_by_key(|e| e.seq);
        let mut s = Schedule::empty(n);
        let mut group_idx: HashMap<u64, u32> = HashMap::new();
        // (group, world rank) -> its stream's (last send, last matched receive, sends so far)
        type Stream = (Option<u32>, Option<u32>, u32);
        let mut stream: HashMap<(u64, usize), Stream> = HashMap::new();
        // world rank -> (group, transfer) of its last completed receive
        let mut last_recv: Vec<Option<(u64, u32)>> = vec![None; n];
        let mut pending: HashMap<(u64, usize, usize), VecDeque<u32>> = HashMap::new();
        for e in ev {
            if e.src >= n || e.dst >= n {
                return Err(Error::InvalidArgument(format!(
                    "recorded event {} -> {} outside topology {} ({n} ranks)",
                    e.src, e.dst, topo.name
                )));
            }
            match e.kind {
                EventKind::Send => {
                    let g = *group_idx.entry(e.group).or_insert_with(|| {
                        s.rings.push(format!("group{}", e.group));
                        (s.rings.len() - 1) as u32
                    });
                    let st = stream.entry((e.group, e.src)).or_insert((None, None, 0));
                    let id = s.transfers.len() as u32;
                    s.transfers.push(Transfer {
                        src: e.src as u32,
                        dst: e.dst as u32,
                        bytes: e.bytes as u64,
                        class: topo.link_class(e.src, e.dst),
                        rank: e.src as u32,
                        step: st.2,
                        ring: g,
                    });
                    let mut deps: Vec<u32> = st.0.into_iter().chain(st.1).collect();
                    if let Some((og, t)) = last_recv[e.src] {
                        if og != e.group && !deps.contains(&t) {
                            deps.push(t);
                        }
                    }
                    s.dep_list.extend(deps);
                    s.dep_start.push(s.dep_list.len() as u32);
                    st.0 = Some(id);
                    st.2 += 1;
                    pending
                        .entry((e.group, e.src, e.dst))
                        .or_default()
                        .push_back(id);
                }
                EventKind::Recv => {
                    let t = pending
                        .get_mut(&(e.group, e.src, e.dst))
                        .and_then(|q| q.pop_front())
                        .ok_or_else(|| {
                            Error::InvalidUsage(format!(
                                "recorded receive {} <- {} (group {}) has no matching send",
                                e.dst, e.src, e.group
                            ))
                        })?;
                    if s.transfers[t as usize].bytes != e.bytes as u64 {
                        return Err(Error::InvalidUsage(format!(
                            "recorded receive {} <- {} of {} bytes matched a send of {}",
                            e.dst, e.src, e.bytes, s.transfers[t as usize].bytes
                        )));
                    }
                    stream.entry((e.group, e.dst)).or_insert((None, None, 0)).1 = Some(t);
                    last_recv[e.dst] = Some((e.group, t));
                }
            }
        }
        s.check_acyclic()?;
        Ok(s)
    }
}

/// Incremental [`Schedule::from_plans`]: plans are added one rank at a time (so a dry
/// run never holds more than one plan), receives resolved at the end.
struct Builder<'a> {
    topo: &'a Topology,
    members: &'a [usize],
    sizes: Vec<usize>,
    strides: Vec<usize>,
    flat: u32,
    s: Schedule,
    /// Per transfer: (send list, ordinal) its step's receive is matched by, and the
    /// bytes it expects.
    recv: Vec<(u32, u32)>,
    recv_bytes: Vec<u64>,
    /// Per transfer: the same-rank transfers (steps) whose completion it waits for.
    local_start: Vec<u32>,
    local: Vec<u32>,
    /// Send lists: per (ring, src, dst) the transfers in send order, and how many
    /// receives claimed one.
    lists: Vec<Vec<u32>>,
    claimed: Vec<u32>,
    /// keys[src world] = [(ring, dst world, list)] (rings have one or two peers per
    /// rank, so a linear search is the fastest map).
    keys: Vec<Vec<(u32, u32, u32)>>,
    /// First transfer of each comm rank's plan (plans are added in rank order), plus the end.
    rank_start: Vec<usize>,
}

impl<'a> Builder<'a> {
    fn new(topo: &'a Topology, h: Option<&Hierarchy>, members: &'a [usize]) -> Result<Builder<'a>> {
        let n = topo.world_size();
        if let Some(&bad) = members.iter().find(|&&m| m >= n) {
            return Err(Error::InvalidArgument(format!(
                "member {bad} outside topology {} ({n} ranks)",
                topo.name
            )));
        }
        let sizes = h.map(|h| h.sizes()).unwrap_or_default();
        if !sizes.is_empty() && sizes.iter().product::<usize>() != members.len() {
            return Err(Error::InvalidArgument(format!(
                "hierarchy {sizes:?} does not cover {} members",
                members.len()
            )));
        }
        let strides = (0..sizes.len())
            .map(|i| sizes[i + 1..].iter().product())
            .collect();
        let mut s = Schedule::empty(n);
        if let Some(h) = h {
            s.rings = h.levels.iter().map(|(l, _)| l.name().to_string()).collect();
        }
        s.rings.push("flat".into());
        Ok(Builder {
            topo,
            members,
            flat: (s.rings.len() - 1) as u32,
            sizes,
            strides,
            s,
            recv: Vec::new(),
            recv_bytes: Vec::new(),
            local_start: vec![0],
            local: Vec::new(),
            lists: Vec::new(),
            claimed: Vec::new(),
            keys: vec![Vec::new(); n],
            rank_start: vec![0],
        })
    }

    /// World rank of the peer with index `y` on `ring`, seen from comm rank `r`.
    fn peer(&self, r: usize, ring: Ring, y: usize) -> Result<usize> {
        let c = match ring {
            Ring::Flat => y,
            Ring::Channel(c) => {
                if self.members.len() != self.topo.world_size() {
                    return Err(Error::InvalidArgument(format!(
                        "plan of rank {r}: channel rings span the whole topology, not {} of its {} ranks",
                        self.members.len(),
                        self.topo.world_size()
                    )));
                }
                let rings = channels::ring_channels(self.topo);
                if c >= rings || y >= self.members.len() {
                    return Err(Error::InvalidArgument(format!(
                        "plan of rank {r}: position {y} of channel ring {c} outside the model's {rings} rings of {} ranks",
                        self.members.len()
                    )));
                }
                channels::channel_rank(self.topo, c, rings, y)
            }
            Ring::Level(i) => {
                let (g, st) = match (self.sizes.get(i), self.strides.get(i)) {
                    (Some(&g), Some(&st)) => (g, st),
                    _ => {
                        return Err(Error::InvalidArgument(format!(
                            "plan of rank {r} uses level {i} of a {}-level hierarchy",
                            self.sizes.len()
                        )))
                    }
                };
                if y >= g {
                    return Err(Error::InvalidArgument(format!(
                        "plan of rank {r}: peer {y} outside level {i} of size {g}"
                    )));
                }
                let xi = (r / st) % g;
                r - xi * st + y * st
            }
        };
        self.members.get(c).copied().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "plan of rank {r}: peer {c} outside the {} members",
                self.members.len()
            ))
        })
    }

    fn list(&mut self, ring: u32, src: usize, dst: usize) -> u32 {
        if let Some(k) = self.keys[src]
            .iter()
            .find(|k| k.0 == ring && k.1 == dst as u32)
        {
            return k.2;
        }
        let id = self.lists.len() as u32;
        self.lists.push(Vec::new());
        self.claimed.push(0);
        self.keys[src].push((ring, dst as u32, id));
        id
    }

    fn add(&mut self, r: usize, plan: &Plan) -> Result<()> {
        if r + 1 != self.rank_start.len() {
            return Err(Error::Internal(format!(
                "plan of rank {r} added out of order"
            )));
        }
        let me = self.members[r];
        let base = self.s.transfers.len();
        if r == 0 {
            // Plans of one collective have (nearly) the same length on every rank.
            let est = plan.steps.len() * self.members.len();
            self.s.transfers.reserve(est);
            self.recv.reserve(est);
            self.recv_bytes.reserve(est);
            self.local_start.reserve(est);
            self.local.reserve(est + est / 4);
        }
        // Channel rings get labels `channel<c>` after `flat`, on first use.
        for st in &plan.steps {
            if let Ring::Channel(c) = st.ring {
                while self.s.rings.len() <= self.flat as usize + 1 + c {
                    let next = self.s.rings.len() - self.flat as usize - 1;
                    self.s.rings.push(format!("channel{next}"));
                }
            }
        }
        // Last step per ring label on this rank's streams.
        let mut last: Vec<Option<u32>> = vec![None; self.s.rings.len()];
        for (k, st) in plan.steps.iter().enumerate() {
            let ring = match st.ring {
                Ring::Flat => self.flat,
                Ring::Level(i) => i as u32,
                Ring::Channel(c) => self.flat + 1 + c as u32,
            };
            let dst = self.peer(r, st.ring, st.dst)?;
            let src = self.peer(r, st.ring, st.src)?;
            let id = (base + k) as u32;
            self.s.transfers.push(Transfer {
                src: me as u32,
                dst: dst as u32,
                bytes: st.send.len as u64,
                class: self.topo.link_class(me, dst),
                rank: r as u32,
                step: k as u32,
                ring,
            });
            let l = self.list(ring, me, dst);
            self.lists[l as usize].push(id);
            let l = self.list(ring, src, me);
            let ord = self.claimed[l as usize];
            self.claimed[l as usize] += 1;
            self.recv.push((l, ord));
            self.recv_bytes.push(st.recv.len as u64);
            let slot = &mut last[ring as usize];
            self.local.extend(slot.iter().copied());
            *slot = Some(id);
            for &d in &st.deps {
                if d >= k {
                    return Err(Error::InvalidArgument(format!(
                        "plan of rank {r}: step {k} depends on later step {d}"
                    )));
                }
                self.local.push((base + d) as u32);
            }
            self.local_start.push(self.local.len() as u32);
        }
        self.rank_start.push(self.s.transfers.len());
        Ok(())
    }

    fn finish(mut self) -> Result<Schedule> {
        let n = self.s.transfers.len();
        if n >= u32::MAX as usize {
            return Err(Error::InvalidArgument(format!("{n} transfers: too many")));
        }
        for (l, sends) in self.lists.iter().enumerate() {
            if sends.len() != self.claimed[l] as usize {
                let (src, (ring, dst, _)) = self
                    .keys
                    .iter()
                    .enumerate()
                    .find_map(|(s, ks)| ks.iter().find(|k| k.2 == l as u32).map(|k| (s, *k)))
                    .unwrap_or((0, (0, 0, 0)));
                return Err(Error::InvalidUsage(format!(
                    "unmatched {}: world rank {src} sends {} message(s) to {dst} on ring {} \
                     which receives {}",
                    if sends.len() < self.claimed[l] as usize {
                        "receive (deadlock)"
                    } else {
                        "send"
                    },
                    sends.len(),
                    self.s
                        .rings
                        .get(ring as usize)
                        .map(String::as_str)
                        .unwrap_or("?"),
                    self.claimed[l]
                )));
            }
        }
        let matched: Vec<u32> = self
            .recv
            .iter()
            .map(|&(l, o)| self.lists[l as usize][o as usize])
            .collect();
        for (i, &m) in matched.iter().enumerate() {
            let (want, got) = (self.recv_bytes[i], self.s.transfers[m as usize].bytes);
            if want != got {
                let t = &self.s.transfers[i];
                return Err(Error::InvalidUsage(format!(
                    "rank {} step {} receives {want} bytes but its peer sends {got}",
                    t.rank, t.step
                )));
            }
        }
        // Number the transfers step-major (every rank's step 0, then step 1, ...): a
        // transfer's dependents (its rank's next step, its receiver's next step) then lie
        // about one rank count away, which keeps the replay's accesses cache-local.
        let mut order: Vec<u32> = Vec::with_capacity(n);
        let steps = |r: usize| self.rank_start[r + 1] - self.rank_start[r];
        let most = (0..self.rank_start.len() - 1).map(steps).max().unwrap_or(0);
        for k in 0..most {
            for r in 0..self.rank_start.len() - 1 {
                if k < steps(r) {
                    order.push((self.rank_start[r] + k) as u32);
                }
            }
        }
        let mut new_of = vec![0u32; n];
        for (i, &o) in order.iter().enumerate() {
            new_of[o as usize] = i as u32;
        }
        let old = std::mem::take(&mut self.s.transfers);
        self.s.transfers = order.iter().map(|&o| old[o as usize]).collect();
        drop(old);
        let mut deps: Vec<u32> = Vec::with_capacity(8);
        self.s.dep_list.reserve(self.local.len() * 2);
        for &o in &order {
            let o = o as usize;
            deps.clear();
            for &d in &self.local[self.local_start[o] as usize..self.local_start[o + 1] as usize] {
                for x in [d, matched[d as usize]] {
                    let x = new_of[x as usize];
                    if !deps.contains(&x) {
                        deps.push(x);
                    }
                }
            }
            self.s.dep_list.extend_from_slice(&deps);
            if self.s.dep_list.len() >= u32::MAX as usize {
                return Err(Error::InvalidArgument("too many dependencies".into()));
            }
            self.s.dep_start.push(self.s.dep_list.len() as u32);
        }
        self.s.check_acyclic()?;
        Ok(self.s)
    }
}

/// The algorithm `call.algo` resolves to for `call.kind` with `call.count` elements of
/// `call.dtype` on the whole world of `call.topo`, by the one selection rule ([`select::select`], what
/// [`crate::Comm::submit`] runs): `auto` by the alpha-beta estimates, `hier` / `ho-ring`
/// fall back to `ring` where the world does not span 2 or 3 levels.
pub fn resolve(call: &Call) -> Result<Algo> {
    let Call {
        topo,
        kind,
        algo,
        count,
        dtype,
        chunks,
    } = *call;
    if !modeled(algo) {
        return Err(Error::InvalidArgument(format!(
            "the simulator models {MODELED}, not {algo}"
        )));
    }
    let members: Vec<usize> = (0..topo.world_size()).collect();
    let h = Hierarchy::detect(topo, &members);
    let shape = select::Shape {
        kind: Some(kind),
        redop: matches!(kind, Kind::ReduceScatter | Kind::AllReduce)
            .then_some(crate::ReduceOp::Sum),
        count,
        dtype,
        topo,
        members: &members,
        hierarchy: h.as_ref(),
        chunks,
    };
    match select::select(algo, &shape).algo {
        a if modeled(a) && a != Algo::Auto => Ok(a),
        other => Err(Error::InvalidArgument(format!(
            "the simulator models {MODELED}, not {other}"
        ))),
    }
}

/// The algorithms the simulator models (the lossless ones).
const MODELED: &str = "ring, log-step, hier, hier-ring, hier-log, ho-ring and auto";

fn modeled(a: Algo) -> bool {
    matches!(
        a,
        Algo::Ring
            | Algo::LogStep
            | Algo::Hier
            | Algo::HierRing
            | Algo::HierLog
            | Algo::HoRing
            | Algo::Auto
    )
}

/// [`resolve`] after checking that the simulator models the call's kind and that its
/// topology is valid.
pub(crate) fn checked_resolve(call: &Call) -> Result<Algo> {
    if !matches!(
        call.kind,
        Kind::AllGather | Kind::ReduceScatter | Kind::AllReduce
    ) {
        return Err(Error::InvalidArgument(format!(
            "the simulator models all-gather, reduce-scatter and all-reduce, not {}",
            call.kind.name()
        )));
    }
    call.topo.validate()?;
    resolve(call)
}

/// The plan world rank `r` of the whole world runs for `call`, whose `algo` is already
/// resolved (`hier` and `ho-ring` need the hierarchy `h`; without one they are rings).
pub(crate) fn plan_of(call: &Call, h: Option<&Hierarchy>, r: usize) -> Plan {
    let Call {
        topo,
        kind,
        algo,
        count,
        ..
    } = *call;
    let p = topo.world_size();
    let s = call.dtype.size();
    let c = count * s;
    match (algo, h) {
        (Algo::Hier | Algo::HierRing | Algo::HierLog, Some(h)) => {
            let chunk = match kind {
                Kind::AllReduce => count.div_ceil(p.max(1)) * s,
                _ => c,
            };
            let log0 = match algo {
                Algo::HierLog => true,
                Algo::HierRing => false,
                _ => select::stage_log_step(topo, h.levels[0].0.link_class(), h.levels[0].1, chunk),
            };
            match kind {
                Kind::AllGather => plan::hier_all_gather(h, r, c, log0),
                Kind::ReduceScatter => plan::hier_reduce_scatter(h, r, c, log0),
                _ => plan::hier_all_reduce(h, r, count, s, log0),
            }
        }
        (Algo::LogStep, _) => match kind {
            Kind::AllGather => log_step::all_gather_plan(Ring::Flat, p, r, c),
            Kind::ReduceScatter => log_step::reduce_scatter_plan(Ring::Flat, p, r, c),
            _ => plan::log_all_reduce(p, r, count, s),
        },
        (Algo::HoRing, Some(h)) => match kind {
            Kind::AllGather => ho_ring::all_gather(h, r, count, s, call.pieces(count)),
            Kind::ReduceScatter => ho_ring::reduce_scatter(h, r, count, s, call.pieces(count)),
            _ => {
                let q = count.div_ceil(p);
                ho_ring::all_reduce(h, r, q, s, call.pieces(q))
            }
        },
        _ => channel_rings(topo, kind, p, r, count, s),
    }
}

/// World rank `r`'s plan of the flat ring as NCCL runs it on `topo`
/// ([`crate::topology::channels`]): the rings of [`channels::ring_channels`], ring `c`
/// carrying its even share of the elements (all-reduce: in whole multiples of `p`, so
/// that every share stays node-symmetric when `p` divides `count`), its steps on
/// [`Ring::Channel`]`(c)` with peers given as positions in ring `c`. Rings with an
/// empty share are left out. One ring: the plain rank-order ring on [`Ring::Flat`].
fn channel_rings(topo: &Topology, kind: Kind, p: usize, r: usize, count: usize, s: usize) -> Plan {
    let base = |pos: usize, n: usize| match kind {
        Kind::AllGather => plan::ring_all_gather(p, pos, n * s),
        Kind::ReduceScatter => plan::ring_reduce_scatter(p, pos, n * s),
        _ => plan::ring_all_reduce(p, pos, n, s),
    };
    let rings = if topo.world_size() == p {
        channels::ring_channels(topo)
    } else {
        1
    };
    if rings <= 1 {
        return base(r, count);
    }
    let shares: Vec<usize> = match kind {
        Kind::AllReduce => {
            let units = crate::transport::ring::even_ranges(count / p.max(1), rings, 1);
            let mut v: Vec<usize> = units.iter().map(|u| u.len() * p).collect();
            if let Some(last) = v.last_mut() {
                *last += count % p.max(1);
            }
            v
        }
        _ => crate::transport::ring::even_ranges(count, rings, 1)
            .iter()
            .map(|u| u.len())
            .collect(),
    };
    let mut out = Plan::default();
    for (c, &n) in shares.iter().enumerate().filter(|(_, &n)| n > 0) {
        let pl = base(channels::channel_pos(topo, c, rings, r), n);
        out.steps.extend(pl.steps.into_iter().map(|mut st| {
            st.ring = Ring::Channel(c);
            st
        }));
    }
    out
}

/// The schedule of `call` on the whole world of its topology, built from the plans every
/// rank would execute, without buffers, threads or data. All-gather, reduce-scatter and
/// all-reduce only (other ops: `InvalidArgument`).
pub fn dry_run(call: &Call) -> Result<Schedule> {
    let algo = checked_resolve(call)?;
    let call = Call { algo, ..*call };
    let p = call.topo.world_size();
    let members: Vec<usize> = (0..p).collect();
    let h = Hierarchy::detect(call.topo, &members);
    let elems = match call.kind {
        Kind::AllReduce => call.count.div_ceil(p.max(1)),
        _ => call.count,
    };
    let mut b = Builder::new(call.topo, h.as_ref(), &members)?;
    for r in 0..p {
        b.add(r, &plan_of(&call, h.as_ref(), r))?;
    }
    let mut sched = b.finish()?;
    sched.algo = Some(algo);
    if algo == Algo::HoRing {
        // As the plans split it: at most one piece per element.
        sched.pieces = Some(plan::pieces(elems, call.pieces(elems)).len());
    }
    Ok(sched)
}

/// Start recording the schedule of everything that moves through the traffic counters
/// `t` of a world on transport `kind` from now on (measured transports only:
/// `InvalidUsage` where the transport keeps no transfer log). [`crate::Comm`] wraps it
/// as `start_recording`.
pub fn start_recording(t: Option<&Traffic>, kind: TransportKind) -> Result<()> {
    let t = t.ok_or_else(|| {
        Error::InvalidUsage(format!(
            "the {} transport cannot record schedules",
            kind.name()
        ))
    })?;
    if !kind.traffic_measured() {
        return Err(Error::InvalidUsage(format!(
            "the {} transport records nominal traffic only, not schedules",
            kind.name()
        )));
    }
    t.start_recording();
    Ok(())
}

/// Stop recording and build the schedule of what ran since [`start_recording`] on
/// `topo` (call once every rank's work was waited).
pub fn finish_recording(t: Option<&Traffic>, topo: &Topology) -> Result<Schedule> {
    let t =
        t.ok_or_else(|| Error::InvalidUsage("this transport cannot record schedules".into()))?;
    Schedule::from_recording(topo, &t.take_recording())
}
