//! Node layout from the hosts the ranks run on (the way NCCL learns it at init: every
//! rank contributes a hash of its host, the hashes are all-gathered, ranks with equal
//! hashes share a node).
//!
//! [`host_id`] is this process's host hash: `STRATA_HOST_ID` when set (to emulate a
//! multi-node layout on one machine, e.g. `STRATA_HOST_ID=$((RANK / 4))`), else a hash
//! of the hostname. [`from_host_ids`] turns the world's ids, in world-rank order, into a
//! `nodes:NxR` topology with the generic link figures; strata's rank layout is
//! row-major, so a node's ranks must be consecutive and every node must have as many
//! ranks as the others, else the error says which ranks break it and that
//! `STRATA_TOPOLOGY` can name the layout instead.

use super::Topology;
use crate::error::{Error, Result};

/// Environment variable overriding this process's host identity.
pub const ENV_HOST_ID: &str = "STRATA_HOST_ID";

/// FNV-1a, stable across processes and builds (std's hasher is seeded per process).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// This process's host identity (see the module doc).
pub fn host_id() -> u64 {
    if let Ok(v) = std::env::var(ENV_HOST_ID) {
        if !v.trim().is_empty() {
            return fnv1a(format!("strata-host-id:{}", v.trim()).as_bytes());
        }
    }
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    fnv1a(name.trim().as_bytes())
}

/// The topology of a world whose rank `r` runs on host `ids[r]`.
pub fn from_host_ids(ids: &[u64]) -> Result<Topology> {
    if ids.is_empty() {
        return Err(Error::InvalidArgument("no ranks to lay out".into()));
    }
    // Runs of equal ids in rank order: one per node.
    let mut runs: Vec<(u64, usize, usize)> = Vec::new(); // (id, first rank, count)
    for (r, &id) in ids.iter().enumerate() {
        match runs.last_mut() {
            Some((last, _, n)) if *last == id => *n += 1,
            _ => runs.push((id, r, 1)),
        }
    }
    for (i, a) in runs.iter().enumerate() {
        if let Some(b) = runs[..i].iter().find(|b| b.0 == a.0) {
            return Err(Error::InvalidUsage(format!(
                "ranks {}..{} and {}..{} run on the same host with other ranks between them; strata lays \
                 ranks out node by node (row-major): launch them consecutively (mpirun --map-by core) or set \
                 STRATA_TOPOLOGY",
                b.1,
                b.1 + b.2,
                a.1,
                a.1 + a.2
            )));
        }
    }
    let per = runs[0].2;
    if let Some(bad) = runs.iter().find(|r| r.2 != per) {
        return Err(Error::InvalidUsage(format!(
            "nodes have different rank counts ({} ranks on the host of rank 0, {} on the host of rank {}); \
             set STRATA_TOPOLOGY to describe the layout",
            per, bad.2, bad.1
        )));
    }
    Ok(Topology::uniform(runs.len(), per))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts() {
        assert_eq!(from_host_ids(&[7; 5]).unwrap().name, "nodes:1x5");
        assert_eq!(
            from_host_ids(&[1, 1, 2, 2, 3, 3]).unwrap().name,
            "nodes:3x2"
        );
        let e = from_host_ids(&[1, 1, 2]).unwrap_err().to_string();
        assert!(e.contains("different rank counts"), "{e}");
        let e = from_host_ids(&[1, 2, 1, 2]).unwrap_err().to_string();
        assert!(
            e.contains("same host") && e.contains("STRATA_TOPOLOGY"),
            "{e}"
        );
        assert!(from_host_ids(&[]).is_err());
    }

    #[test]
    fn host_ids_are_stable() {
        assert_eq!(fnv1a(b"node-a"), fnv1a(b"node-a"));
        assert_ne!(fnv1a(b"node-a"), fnv1a(b"node-b"));
    }
}
