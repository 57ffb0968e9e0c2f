//! Node-symmetric replay: the makespan of [`super::dry_run`] + [`super::replay`](fn@super::replay)
//! computed from one node's ranks only (the planner of strata-engine asks it for every
//! collective of a 1024-rank cluster).
//!
//! Why it is exact. On a topology of `b` identical nodes, the plans of `ring`, `hier`
//! and `ho-ring` ([`crate::algo::plan`], [`crate::algo::ho_ring`]) are invariant under the
//! translation `T: rank ↦ rank + R (mod world)` (one node further): every peer is
//! given relative to the rank's own ring coordinate, and every transfer length
//! depends on the step and the piece, not on the rank (the one exception, a ring
//! all-reduce over a count that `p` does not divide, is refused here; the planner
//! rounds all-reduce counts up to a multiple of `p`). The replay's link model is
//! translation-invariant too: ports belong to ranks, NICs to nodes, every link class
//! has one figure, and the ready-time ties one resource sees are between transfers of
//! one node, whose step-major index order (`step · world + rank`) is the same on every
//! node. By induction over the replay's event order, the transfer `T(x)` starts and
//! ends exactly when `x` does. So the schedule can be folded onto node 0: a receive
//! from a rank of node `m` is matched (FIFO per (ring, sender, receiver), as
//! `Schedule::from_plans` matches) to the transfer of the translated sender on node 0
//! towards the translated receiver on node `-m`, which has the same times; the folded
//! dependency graph has `1/b` of the transfers and the same event order, and its
//! makespan is the full one bit for bit (`tests/sim.rs` compares both on
//! multi-node topologies for every op and algorithm).
//!
//! Cost: `R · steps` transfers instead of `R · b · steps`: the ring all-gather over
//! 128 DGX nodes (1 M transfers, about 0.3 s in a release build) folds to 8 K.

use super::schedule::{checked_resolve, plan_of, Call};
use super::waves;
use crate::algo::plan::{Plan, Ring};
use crate::algo::Algo;
use crate::error::{Error, Result};
use crate::kinds::Kind;
use crate::topology::Hierarchy;
use crate::topology::{channels, LinkClass};

/// The algorithm `call.algo` resolves to (as [`super::resolve`]) and the makespan in
/// microseconds of the schedule `dry_run(call)` replayed on `call.topo`, computed on
/// node 0 only (module doc).
///
/// Errors: what `dry_run` refuses (other ops, quantized algorithms, an invalid
/// topology), and `InvalidArgument` for a ring all-reduce whose count the world size
/// does not divide (not node-symmetric) or a schedule that does not fold (never for
/// strata's plans).
pub fn symmetric_makespan(call: &Call) -> Result<(Algo, f64)> {
    let algo = checked_resolve(call)?;
    let call = Call { algo, ..*call };
    let Call {
        topo, kind, count, ..
    } = call;
    let p = topo.world_size();
    let a = topo.ranks_per_node().max(1);
    let nodes = topo.nodes.max(1);
    if p <= 1 {
        return Ok((algo, 0.0));
    }
    if kind == Kind::AllReduce && algo == Algo::Ring && count % p != 0 {
        return Err(Error::InvalidArgument(format!(
            "ring all-reduce of {count} elements on {p} ranks is not node-symmetric (count % p != 0)"
        )));
    }
    let members: Vec<usize> = (0..p).collect();
    let h = Hierarchy::detect(topo, &members);
    let plans: Vec<Plan> = (0..a).map(|r| plan_of(&call, h.as_ref(), r)).collect();

    // Ring labels as Schedule::from_plans numbers them: levels, then `flat`.
    let sizes = h.as_ref().map(|h| h.sizes()).unwrap_or_default();
    let strides: Vec<usize> = (0..sizes.len())
        .map(|i| sizes[i + 1..].iter().product())
        .collect();
    let flat = sizes.len() as u32;
    let rings = channels::ring_channels(topo);
    let peer = |r: usize, ring: Ring, y: usize| -> Result<(u32, usize)> {
        match ring {
            Ring::Flat => Ok((flat, y)),
            Ring::Channel(c) if c < rings && y < p => {
                Ok((flat + 1 + c as u32, channels::channel_rank(topo, c, rings, y)))
            }
            Ring::Channel(c) => Err(Error::InvalidArgument(format!(
                "plan of rank {r}: position {y} of channel ring {c} outside the model's {rings} rings"
            ))),
            Ring::Level(i) => {
                let (g, st) = match (sizes.get(i), strides.get(i)) {
                    (Some(&g), Some(&st)) => (g, st),
                    _ => {
                        return Err(Error::InvalidArgument(format!(
                            "plan of rank {r} uses level {i} of a {}-level hierarchy",
                            sizes.len()
                        )))
                    }
                };
                let xi = (r / st) % g;
                Ok((i as u32, r - xi * st + y * st))
            }
        }
    };

    // Step-major transfer ids over node 0's ranks (the relative order of the full
    // schedule's `step · world + rank` numbering).
    let most = plans.iter().map(|p| p.steps.len()).max().unwrap_or(0);
    let mut id_of: Vec<Vec<u32>> = plans.iter().map(|p| vec![0; p.steps.len()]).collect();
    let mut n = 0usize;
    for k in 0..most {
        for ids in id_of.iter_mut() {
            if let Some(x) = ids.get_mut(k) {
                *x = n as u32;
                n += 1;
            }
        }
    }
    if n >= u32::MAX as usize {
        return Err(Error::InvalidArgument(format!("{n} transfers: too many")));
    }
    // Transfers: (class, bytes); send lists per (ring, sender on node 0, receiver),
    // indexed densely: `(ring · a + sender) · p + receiver`.
    let nrings = sizes.len() + 1 + rings;
    let slot = |ring: u32, src: usize, dst: usize| (ring as usize * a + src) * p + dst;
    let mut list_of = vec![u32::MAX; nrings * a * p];
    let mut lists: Vec<Vec<u32>> = Vec::new();
    let mut class = vec![LinkClass::IntraPackage; n];
    let mut bytes = vec![0u64; n];
    let mut peers: Vec<Vec<(u32, usize)>> = Vec::with_capacity(a);
    for (r, pl) in plans.iter().enumerate() {
        let mut src_of = Vec::with_capacity(pl.steps.len());
        for (k, st) in pl.steps.iter().enumerate() {
            let (ring, dst) = peer(r, st.ring, st.dst)?;
            let (_, src) = peer(r, st.ring, st.src)?;
            if dst >= p || src >= p {
                return Err(Error::InvalidArgument(format!(
                    "plan of rank {r}: peer outside the {p} ranks"
                )));
            }
            let id = id_of[r][k] as usize;
            class[id] = topo.link_class(r, dst);
            bytes[id] = st.send.len as u64;
            let l = &mut list_of[slot(ring, r, dst)];
            if *l == u32::MAX {
                *l = lists.len() as u32;
                lists.push(Vec::new());
            }
            lists[*l as usize].push(id as u32);
            src_of.push((ring, src));
        }
        peers.push(src_of);
    }
    // Receives, folded: the sender on node m is node 0's same local rank, sending to
    // the receiver translated to node -m.
    let mut matched = vec![0u32; n];
    let mut claimed = vec![0usize; lists.len()];
    for (r, pl) in plans.iter().enumerate() {
        for (k, st) in pl.steps.iter().enumerate() {
            let (ring, src) = peers[r][k];
            let m = src / a;
            let l = list_of[slot(ring, src % a, ((nodes - m % nodes) % nodes) * a + r)];
            let t = lists
                .get(l as usize)
                .and_then(|v| v.get(claimed[l as usize]))
                .copied()
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "schedule does not fold onto one node: rank {r} step {k} has no matching send"
                    ))
                })?;
            claimed[l as usize] += 1;
            if bytes[t as usize] != st.recv.len as u64 {
                return Err(Error::InvalidArgument(format!(
                    "schedule does not fold onto one node: rank {r} step {k} receives {} bytes but its peer sends {}",
                    st.recv.len, bytes[t as usize]
                )));
            }
            matched[id_of[r][k] as usize] = t;
        }
    }
    // Dependencies (Schedule::from_plans): the previous step on the same ring and the
    // plan's explicit deps, each as its send and its matched receive; kept as
    // (dependency, dependent) edges (the replay only needs dependents and in-degrees).
    let mut edges: Vec<(u32, u32)> = Vec::with_capacity(2 * n);
    let mut indeg = vec![0u32; n];
    let mut ds: Vec<u32> = Vec::with_capacity(8);
    for (r, pl) in plans.iter().enumerate() {
        let mut last: Vec<Option<usize>> = vec![None; nrings];
        for (k, st) in pl.steps.iter().enumerate() {
            let ring = peers[r][k].0 as usize;
            let me = id_of[r][k];
            ds.clear();
            for d in last[ring].into_iter().chain(st.deps.iter().copied()) {
                if d >= k {
                    return Err(Error::InvalidArgument(format!(
                        "plan of rank {r}: step {k} depends on later step {d}"
                    )));
                }
                let x = id_of[r][d];
                for y in [x, matched[x as usize]] {
                    if !ds.contains(&y) {
                        ds.push(y);
                    }
                }
            }
            last[ring] = Some(k);
            indeg[me as usize] = ds.len() as u32;
            edges.extend(ds.iter().map(|&d| (d, me)));
        }
    }

    // Replay (super::replay's model) on node 0's resources.
    let links = &topo.links;
    let nics = links.nics_per_node.max(1);
    let per_port = (links.nics_per_node / a).max(1);
    let lat: [f64; 3] = LinkClass::ALL.map(|c| links.get(c).latency_us);
    let bw_port = [
        links.intra_package.bandwidth_gbs * 1e3,
        links.intra_node.bandwidth_gbs * 1e3,
    ];
    let bw_nic = per_port as f64 * links.nic_bandwidth_gbs * 1e3;
    let mut src_rank = vec![0usize; n];
    for (r, ids) in id_of.iter().enumerate() {
        for &i in ids {
            src_rank[i as usize] = r;
        }
    }
    let resource = |i: usize| -> usize {
        let r = src_rank[i];
        match class[i] {
            LinkClass::IntraPackage => 2 * r,
            LinkClass::IntraNode => 2 * r + 1,
            LinkClass::InterNode => 2 * a + (r * nics / a).min(nics - 1),
        }
    };
    // Dependents (CSR).
    let mut start = vec![0u32; n + 1];
    for &(d, _) in &edges {
        start[d as usize + 1] += 1;
    }
    for i in 0..n {
        start[i + 1] += start[i];
    }
    let mut fill = start.clone();
    let mut list = vec![0u32; edges.len()];
    for &(d, i) in &edges {
        let f = &mut fill[d as usize];
        list[*f as usize] = i;
        *f += 1;
    }
    drop(edges);
    let mut free = vec![0.0f64; 2 * a + nics];
    let (done, makespan) = waves::run(&mut indeg, &start, &list, |i, rt| {
        let iu = i as usize;
        let res = resource(iu);
        let bw = match class[iu] {
            LinkClass::InterNode => bw_nic,
            c => bw_port[c.index()],
        };
        let wire = bytes[iu] as f64 / bw;
        let st = if free[res] > rt { free[res] } else { rt };
        free[res] = st + wire;
        st + wire + lat[class[iu].index()]
    });
    if done != n {
        return Err(Error::InvalidArgument(format!(
            "schedule does not fold onto one node: {} of {n} transfers wait on a cycle",
            n - done
        )));
    }
    Ok((algo, makespan))
}
