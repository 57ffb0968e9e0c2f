//! Ranks, their coordinates and the link class between any two of them.
//!
//! A [`Topology`] is a regular 3-level hierarchy: `nodes` x `packages_per_node` x
//! `dies_per_package`. A *die* is one rank (an A100, an H100, one GCD of an MI250X); a
//! *package* groups dies that share the fastest link (the two GCDs of one MI250X, the
//! Frontier paper's first level, 002 §IV); a *node* groups packages behind one set of
//! NICs. An optional leaf-switch id per node feeds AMSP's placement (000 §V-D).
//!
//! Rank layout is row-major (contract): `rank = (node * P + package) * D + die`, the
//! layout of a PyTorch DeviceMesh of shape `(nodes, ranks_per_node)`.
//!
//! Topologies come from a SPEC string ([`Topology::parse`], also read from
//! `STRATA_TOPOLOGY` by [`Topology::from_env`]) or from a JSON file written by
//! [`Topology::save`] (the way `NCCL_TOPO_FILE` injects a topology), so every
//! topology-dependent path is testable without hardware.
//!
//! SPEC grammar (case-insensitive, surrounding whitespace ignored):
//!
//! | form | meaning |
//! |---|---|
//! | `nodes:NxR` | N nodes of R ranks; R packages of 1 die, so no `intra_package` links |
//! | `nodes:NxPxD` | N nodes, P packages per node, D dies per package |
//! | `dgx-a100:N`, `dgx-h100:N`, `p3dn:N`, `p4d:N`, `p5:N` | N nodes of 8 GPUs (8 packages x 1 die) |
//! | `frontier:N` | N nodes of 4 MI250X packages x 2 GCDs |
//! | any of the above + `,switch=K` | K consecutive nodes per leaf switch (`switch_of_node[n] = n / K`) |
//! | `path/to/file.json` | a file written by [`Topology::save`] |
//!
//! Link figures of every preset, with their sources, are in [`presets`].

#![forbid(unsafe_code)]

pub mod channels;
pub mod detect;
pub mod gcd;
pub mod grouping;
pub mod hierarchy;
mod layout;
pub mod presets;
mod spec;

pub use hierarchy::Hierarchy;
pub use layout::*;
