//! Groups and shard indices of a rank under a [`Strategy`].
//!
//! World rank `r` sits at node `n = r / R`, local index `l = r % R` (row-major, like a
//! PyTorch DeviceMesh of shape (nodes, R)). The group of factor `a x b` holding `r` is
//! the aligned block of local indices `⌊l/a⌋·a .. +a` on nodes `⌊n/b⌋·b .. +b`; the
//! rank's index in it is `(n mod b)·a + (l mod a)`.
//!
//! Shard indices nest (AMSP §IV-B dependency rule): with `s_p | s_g | s_os`,
//!
//! - P index `i_p` = index in the P group;
//! - G index `i_g = i_p·(s_g/s_p) + j_gp`, where `j_gp` is the rank's index in the G/P
//!   subgroup (the ranks of its G group with the same P index);
//! - OS index `i_os = i_g·(s_os/s_g) + j_og` (`j_og`: index in the OS/G subgroup).
//!
//! So a rank's OS shard lies inside its G shard, which lies inside its P shard, and the
//! sub-index of the OS shard inside the P shard is `j_gp·(s_os/s_g) + j_og`: the order
//! of the OS/P subgroup whose all-gather spreads updated parameters.

use crate::config::{Factor, Mesh, Strategy};

/// Where one rank sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pos {
    pub node: usize,
    pub local: usize,
}

impl Pos {
    /// Position of world rank `r` on `mesh`.
    pub fn of(mesh: Mesh, r: usize) -> Pos {
        let rpn = mesh.ranks_per_node.max(1);
        Pos {
            node: r / rpn,
            local: r % rpn,
        }
    }

    /// Color of this rank's group of factor `f` (unique per group).
    pub fn group(self, mesh: Mesh, f: Factor) -> usize {
        (self.node / f.inter) * (mesh.ranks_per_node / f.intra) + self.local / f.intra
    }

    /// Index in its group of factor `f`.
    pub fn index(self, f: Factor) -> usize {
        (self.node % f.inter) * f.intra + self.local % f.intra
    }

    /// Index in the X/Y subgroup (ranks of its X group with the same Y index).
    pub fn sub_index(self, x: Factor, y: Factor) -> usize {
        let q = y.quotient(x);
        ((self.node % x.inter) / y.inter) * q.intra + (self.local % x.intra) / y.intra
    }
}

/// Split instructions (color, key) for every group the runtime uses, and the rank's shard
/// indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Groups {
    pub pos: Pos,
    /// P group (size s_p).
    pub p: (u32, i32),
    /// hpZ secondary group (size s_hpz) where configured.
    pub hpz: Option<(u32, i32)>,
    /// G/P subgroup (size s_g/s_p).
    pub gp: (u32, i32),
    /// OS/G subgroup (size s_os/s_g).
    pub og: (u32, i32),
    /// OS/P subgroup in world-rank order (size s_os/s_p); [`Groups::op_order`] maps its
    /// ranks to the OS shards' places inside the P shard.
    pub op: (u32, i32),
    /// Ranks holding the same P shard (size s_dp/s_p): AMSP's boundary all-reduce.
    pub p_replicas: (u32, i32),
    /// Ranks holding the same OS shard (size s_dp/s_os): MiCS's 2-hop all-reduce.
    pub os_replicas: (u32, i32),
    /// Index in the P group.
    pub i_p: usize,
    /// Index in the G/P subgroup.
    pub j_gp: usize,
    /// Index of the OS shard inside the P shard (= index in the OS/P subgroup).
    pub j_op: usize,
    /// Index in the hpZ group.
    pub i_hpz: usize,
}

fn c(x: usize) -> u32 {
    x as u32
}

impl Groups {
    /// The groups of world rank `r` under `s` on `mesh` (`s` validated for `mesh`).
    pub fn new(s: &Strategy, mesh: Mesh, r: usize) -> Groups {
        let pos = Pos::of(mesh, r);
        let (sp, sg, so) = (s.p.size(), s.g.size(), s.os.size());
        let i_p = pos.index(s.p);
        let j_gp = pos.sub_index(s.g, s.p);
        let j_og = pos.sub_index(s.os, s.g);
        let i_g = i_p * (sg / sp) + j_gp;
        let i_os = i_g * (so / sg) + j_og;
        let j_op = j_gp * (so / sg) + j_og;
        let key = r as i32;
        Groups {
            pos,
            p: (c(pos.group(mesh, s.p)), i_p as i32),
            hpz: s.hpz.map(|h| (c(pos.group(mesh, h)), pos.index(h) as i32)),
            gp: (c(pos.group(mesh, s.g) * sp + i_p), j_gp as i32),
            og: (c(pos.group(mesh, s.os) * sg + i_g), j_og as i32),
            op: (c(pos.group(mesh, s.os) * sp + i_p), key),
            p_replicas: (c(i_p), key),
            os_replicas: (c(i_os), key),
            i_p,
            j_gp,
            j_op,
            i_hpz: s.hpz.map(|h| pos.index(h)).unwrap_or(0),
        }
    }
}

impl Groups {
    /// For each rank of this rank's OS/P subgroup, in world order (its communicator's
    /// order), the place of its OS shard inside the P shard. The identity where the
    /// nesting order is row-major (zero1, zero2, PaRO-IGG/IIG); PaRO-NIG's is
    /// local-index-major, which a world-ordered ring would turn into all-inter-node
    /// traffic, so the spread gathers in world order and permutes locally instead.
    pub fn op_order(&self, s: &Strategy, mesh: Mesh) -> Vec<usize> {
        (0..mesh.world())
            .map(|r| Groups::new(s, mesh, r))
            .filter(|g| g.op.0 == self.op.0)
            .map(|g| g.j_op)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Every subgroup has the size the strategy implies, and the OS shards of a P group
    /// tile the P shard exactly once per OS/P subgroup.
    #[test]
    fn groups_have_their_sizes_and_shards_nest() {
        let mesh = Mesh::new(4, 4);
        for spec in [
            "zero3",
            "zero1",
            "zero2",
            "mics:2",
            "mics:8",
            "paro-igg",
            "paro-iig",
            "paro-nig",
            "amsp:p=2x1,g=4x1,os=4x2",
            "amsp:p=1x1,g=2x2,os=4x4",
        ] {
            let s = Strategy::parse(spec, mesh).unwrap();
            let gs: Vec<Groups> = (0..16).map(|r| Groups::new(&s, mesh, r)).collect();
            let count = |f: &dyn Fn(&Groups) -> (u32, i32)| {
                let mut m: BTreeMap<u32, Vec<i32>> = BTreeMap::new();
                gs.iter()
                    .for_each(|g| m.entry(f(g).0).or_default().push(f(g).1));
                m
            };
            let check = |name: &str, m: BTreeMap<u32, Vec<i32>>, size: usize| {
                for (col, mut keys) in m {
                    assert_eq!(keys.len(), size, "{spec} {name} color {col}");
                    keys.sort();
                    if !matches!(name, "p_replicas" | "os_replicas" | "op") {
                        assert_eq!(keys, (0..size as i32).collect::<Vec<_>>(), "{spec} {name}");
                    }
                }
            };
            let (sp, sg, so) = (s.p.size(), s.g.size(), s.os.size());
            check("p", count(&|g| g.p), sp);
            check("gp", count(&|g| g.gp), sg / sp);
            check("og", count(&|g| g.og), so / sg);
            check("op", count(&|g| g.op), so / sp);
            check("p_replicas", count(&|g| g.p_replicas), 16 / sp);
            check("os_replicas", count(&|g| g.os_replicas), 16 / so);
        }
    }
}
