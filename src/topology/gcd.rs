//! MI250X GCD pairing: which HIP devices share an MI250X package.
//!
//! An MI250X holds two GCDs (graphics compute dies), each a HIP device of its own, joined
//! by the in-package Infinity Fabric (4 links, 200 GB/s bidirectional on Frontier /
//! LUMI-G); GCDs of different packages are joined by 1 or 2 Infinity Fabric links or
//! not at all. strata's `package` level ([`super::Topology`]) is that pair.
//!
//! [`pair_gcds`] derives the pairs from the pairwise link matrix that
//! `hipExtGetLinkTypeAndHopCount` reports (`crate::device::hip::gcd_links`, feature
//! `rocm`): entry `[i][j]` is `(link type, hop count)`, link type as
//! `hsa_amd_link_info_type_t` ([`LINK_TYPE_XGMI`] = 4, [`LINK_TYPE_PCIE`] = 2).
//!
//! Rule (documented contract): every device's *closest peer* is the unique device it
//! reaches over XGMI with the fewest hops; the closest-peer relation must be a perfect
//! matching (each device's closest peer has it as its own closest peer). Anything else
//! is an error that says which device breaks it: a device with no XGMI peer (PCIe-only
//! GPUs), a tie (two peers equally close), a relation that is not mutual, an odd
//! number of devices, or a malformed matrix (not square, not symmetric).
//!
//! Limit, and why the rule refuses ties instead of guessing: the hop count that HIP
//! reports is the KFD io-link weight divided by 15 (ROCclr's `findLinkInfo`; the kernel
//! driver's `kfd_crat.c` sets the XGMI weight to 15 x the XGMI hop count of the PSP
//! topology), and for MI250X that count is 1 for *every* pair of GCDs that has a direct
//! link, inside the package or not (ROCm/rocm-systems issue #5763, "clarify what hops
//! means"; open-mpi/hwloc issue #775). On such a node, whose GCDs also have direct links
//! to GCDs of other packages, the matrix ties and [`pair_gcds`] fails with a message
//! naming the tie; the package layout then comes from `STRATA_TOPOLOGY` (e.g.
//! `frontier:N`, whose layout puts devices 2k and 2k+1 in package k; check that the
//! node numbers its GCDs that way, e.g. with the XGMI bandwidths of
//! `rocm-smi --shownodesbw`). A runtime or driver that reports the in-package link as
//! strictly closer (fewer hops) pairs the GCDs as intended.
//!
//! No PCI-bus-id fallback: the GCDs of Frontier-class nodes are said to sit at bus ids
//! such as c1/c6, c9/ce, d1/d6, d9/de, but no public document found states a rule from
//! bus ids to packages, so strata does not guess one.

use crate::error::{Error, Result};

/// Pairwise links of `n` devices: `m[i][j]` is `Some((link type, hop count))` or `None`
/// (no link, or the diagonal).
pub type LinkMatrix = Vec<Vec<Option<(u32, u32)>>>;

/// `HSA_AMD_LINK_INFO_TYPE_PCIE` (hsa_ext_amd.h).
pub const LINK_TYPE_PCIE: u32 = 2;
/// `HSA_AMD_LINK_INFO_TYPE_XGMI` (hsa_ext_amd.h): Infinity Fabric between GPUs.
pub const LINK_TYPE_XGMI: u32 = 4;

/// The package index of every device from its link matrix (see the module doc for the
/// rule): devices `i` and `j` share package `p` when each is the other's unique closest
/// XGMI peer. Packages are numbered in the order of their lowest device (devices 0 and 1
/// paired, then 2 and 3: `[0, 0, 1, 1]`). Diagonal entries are ignored. The matrix is
/// that of the *visible* devices: of two GCDs of different packages that are each
/// other's only visible XGMI peer (a job given one GCD of each of two packages), the rule
/// cannot tell that they are not package mates.
///
/// Errors: [`Error::InvalidArgument`] for a malformed matrix (a row of the wrong length,
/// `links[i][j] != links[j][i]`); [`Error::InvalidUsage`] when the links do not form a
/// perfect GCD pairing (odd device count, a device without an XGMI peer, a tie, a
/// closest-peer relation that is not mutual), naming the device and its links.
pub fn pair_gcds(links: &[Vec<Option<(u32, u32)>>]) -> Result<Vec<usize>> {
    let n = links.len();
    for (i, row) in links.iter().enumerate() {
        if row.len() != n {
            return Err(Error::InvalidArgument(format!(
                "GCD link matrix: row {i} has {} entries, expected {n} (one per device)",
                row.len()
            )));
        }
    }
    for (i, row) in links.iter().enumerate() {
        for (j, &l) in row.iter().enumerate().skip(i + 1) {
            if l != links[j][i] {
                return Err(Error::InvalidArgument(format!(
                    "GCD link matrix is not symmetric: device {i} -> {j} is {}, {j} -> {i} is {}",
                    show(l),
                    show(links[j][i])
                )));
            }
        }
    }
    if n % 2 != 0 {
        return Err(Error::InvalidUsage(format!(
            "{n} devices cannot form MI250X GCD pairs (an odd count); {HINT}"
        )));
    }
    let mut closest = Vec::with_capacity(n);
    for (i, row) in links.iter().enumerate() {
        let xgmi = || {
            row.iter()
                .enumerate()
                .filter(move |&(j, _)| j != i)
                .filter_map(|(j, l)| match *l {
                    Some((LINK_TYPE_XGMI, hops)) => Some((j, hops)),
                    _ => None,
                })
        };
        let Some(best) = xgmi().map(|(_, h)| h).min() else {
            return Err(Error::InvalidUsage(format!(
                "device {i} has no XGMI (Infinity Fabric) peer, so it is not an MI250X GCD \
                 (its links: {}); {HINT}",
                show_row(row, i)
            )));
        };
        let ties: Vec<usize> = xgmi().filter(|&(_, h)| h == best).map(|(j, _)| j).collect();
        if ties.len() > 1 {
            return Err(Error::InvalidUsage(format!(
                "device {i}'s closest XGMI peers tie: devices {ties:?} at {best} hop(s), so the \
                 link matrix does not tell its package partner (ROCm reports 1 hop for every \
                 directly linked MI250X GCD); {HINT}"
            )));
        }
        closest.push(ties[0]);
    }
    for (i, &j) in closest.iter().enumerate() {
        if closest[j] != i {
            return Err(Error::InvalidUsage(format!(
                "GCD pairing is not mutual: device {i}'s closest XGMI peer is {j}, but {j}'s is \
                 {}; {HINT}",
                closest[j]
            )));
        }
    }
    let mut package = vec![usize::MAX; n];
    let mut next = 0;
    for i in 0..n {
        if package[i] == usize::MAX {
            package[i] = next;
            package[closest[i]] = next;
            next += 1;
        }
    }
    Ok(package)
}

const HINT: &str = "name the layout with STRATA_TOPOLOGY instead (e.g. frontier:N)";

fn show(l: Option<(u32, u32)>) -> String {
    match l {
        None => "no link".into(),
        Some((t, h)) => {
            let kind = match t {
                LINK_TYPE_XGMI => "XGMI".to_string(),
                LINK_TYPE_PCIE => "PCIe".to_string(),
                other => format!("link type {other}"),
            };
            format!("{kind} {h} hop(s)")
        }
    }
}

fn show_row(row: &[Option<(u32, u32)>], i: usize) -> String {
    row.iter()
        .enumerate()
        .filter(|&(j, _)| j != i)
        .map(|(j, &l)| format!("{j}: {}", show(l)))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    type M = LinkMatrix;

    /// Symmetric matrix of `n` devices with `link(i, j)` for i != j.
    fn matrix(n: usize, link: impl Fn(usize, usize) -> Option<(u32, u32)>) -> M {
        (0..n)
            .map(|i| {
                (0..n)
                    .map(|j| {
                        if i == j {
                            None
                        } else {
                            link(i.min(j), i.max(j))
                        }
                    })
                    .collect()
            })
            .collect()
    }

    /// Illustrative Frontier-like node (not the exact wiring): 8 GCDs, package k =
    /// GCDs `perm[2k]`, `perm[2k+1]` at 1 hop; other GCDs at 2 hops when their packages
    /// are neighbours on a ring of the 4 packages, else 3.
    fn frontier_like(perm: [usize; 8]) -> M {
        let pkg = |d: usize| perm.iter().position(|&x| x == d).unwrap() / 2;
        matrix(8, |i, j| {
            let (a, b) = (pkg(i), pkg(j));
            let hops = if a == b {
                1
            } else if (a + 1) % 4 == b || (b + 1) % 4 == a {
                2
            } else {
                3
            };
            Some((LINK_TYPE_XGMI, hops))
        })
    }

    #[test]
    fn frontier_like_node_pairs_its_gcds() {
        let m = frontier_like([0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(pair_gcds(&m).unwrap(), vec![0, 0, 1, 1, 2, 2, 3, 3]);
        // Another numbering: packages {0,5}, {1,2}, {3,7}, {4,6}, numbered by lowest GCD.
        let m = frontier_like([0, 5, 1, 2, 3, 7, 4, 6]);
        assert_eq!(pair_gcds(&m).unwrap(), vec![0, 1, 1, 2, 3, 0, 3, 2]);
        // Diagonal entries are ignored.
        let mut m = frontier_like([0, 1, 2, 3, 4, 5, 6, 7]);
        m[3][3] = Some((LINK_TYPE_XGMI, 0));
        assert_eq!(pair_gcds(&m).unwrap(), vec![0, 0, 1, 1, 2, 2, 3, 3]);
    }

    #[test]
    fn ties_as_rocm_reports_them_are_refused() {
        // As ROCm reports an MI250X node: 1 hop for every directly linked pair, the
        // in-package partner and the directly linked GCDs of other packages alike.
        let direct = |i: usize, j: usize| i / 2 == j / 2 || (i + j) % 3 == 0;
        let m = matrix(8, |i, j| {
            Some((LINK_TYPE_XGMI, if direct(i, j) { 1 } else { 2 }))
        });
        let e = pair_gcds(&m).unwrap_err();
        assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
        let s = e.to_string();
        assert!(
            s.contains("device 0's closest XGMI peers tie: devices [1, 3, 6] at 1 hop"),
            "{s}"
        );
        assert!(s.contains("STRATA_TOPOLOGY"), "{s}");
    }

    #[test]
    fn four_pcie_gpus_have_no_pairs() {
        // 4 GPUs on PCIe only (a DGX-like box of single-die GPUs, or MI210s without a bridge).
        let m = matrix(4, |i, j| {
            Some((LINK_TYPE_PCIE, 1 + u32::from(i / 2 != j / 2)))
        });
        let e = pair_gcds(&m).unwrap_err();
        assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
        let s = e.to_string();
        assert!(s.contains("device 0 has no XGMI"), "{s}");
        assert!(s.contains("1: PCIe 1 hop(s), 2: PCIe 2 hop(s)"), "{s}");
        // 4 GPUs in one XGMI hive, all 1 hop (MI100-like): nobody is closest.
        let m = matrix(4, |_, _| Some((LINK_TYPE_XGMI, 1)));
        assert!(pair_gcds(&m).unwrap_err().to_string().contains("tie"));
        // No links at all.
        let m = matrix(4, |_, _| None);
        assert!(pair_gcds(&m).unwrap_err().to_string().contains("no link"));
    }

    #[test]
    fn malformed_matrices_are_rejected() {
        assert_eq!(pair_gcds(&[]).unwrap(), Vec::<usize>::new());
        // Not square.
        let mut m = frontier_like([0, 1, 2, 3, 4, 5, 6, 7]);
        m[5].pop();
        let e = pair_gcds(&m).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        assert!(
            e.to_string().contains("row 5 has 7 entries, expected 8"),
            "{e}"
        );
        // Not symmetric.
        let mut m = frontier_like([0, 1, 2, 3, 4, 5, 6, 7]);
        m[2][6] = Some((LINK_TYPE_PCIE, 3));
        let e = pair_gcds(&m).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        assert!(
            e.to_string().contains("device 2 -> 6 is PCIe 3 hop(s)"),
            "{e}"
        );
        // Odd count.
        let m = matrix(3, |_, _| Some((LINK_TYPE_XGMI, 1)));
        assert!(pair_gcds(&m).unwrap_err().to_string().contains("odd"));
        // A single device.
        assert!(pair_gcds(&[vec![None]]).is_err());
    }

    #[test]
    fn closest_peers_must_be_mutual() {
        // 0 -> 1 (2 hops), 1 <-> 2 (1 hop), 3 -> 2 (2 hops): unique but not a matching.
        let hops = |i: usize, j: usize| match (i, j) {
            (1, 2) => 1,
            (0, 1) | (2, 3) => 2,
            _ => 3,
        };
        let m = matrix(4, |i, j| Some((LINK_TYPE_XGMI, hops(i, j))));
        let e = pair_gcds(&m).unwrap_err();
        assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
        assert!(
            e.to_string()
                .contains("device 0's closest XGMI peer is 1, but 1's is 2"),
            "{e}"
        );
    }
}
