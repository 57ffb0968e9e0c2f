//! The candidate set: AMSP's filtered brute force plus every preset.
//!
//! AMSP §V-B minimizes `T_comm(s_p⁰, s_p¹, s_g⁰, s_g¹, s_os⁰, s_os¹)` (eq. 1) subject to
//! `D_total <= GPU_Memory_Capacity` (eq. 2) and
//! - eq. 3: `1 <= s_p⁰ <= s_g⁰ <= s_os⁰ <= s_dp⁰ <= R`,
//! - eq. 4: `1 <= s_p¹ <= s_g¹ <= s_os¹ <= s_dp¹ <= N`,
//! - eq. 5: `s_i⁰ · k = s_dp⁰, k ∈ Z, i ∈ {p, g, os}`,
//! - eq. 6: `s_j¹ · k = s_dp¹, k ∈ Z, j ∈ {p, g, os}`,
//! - eq. 7: `s_i⁰ = s_dp⁰ if s_i¹ > 1, i ∈ {p, g, os}`,
//!
//! with `s_dp = R x N` (AMSP Table IV note 1) and `s_g ∈ {s_p, s_os}` (§IV-C3). The
//! engine's dependency rule (config.rs) is the divisibility form of eqs 3-4 (each
//! factor divides the next), which eqs 5-6 imply for power-of-two meshes and which the
//! runtime needs for shards to nest; the enumeration requires it. AMSP candidates sync
//! gradients with all-reduce (`sync=ar`, §IV-C2/3) and take `auto` algorithms.
//!
//! Presets (config.rs, expanded for the mesh): `dp`, `zero1`, `zero2`, `zero3`,
//! `mics:R` and `mics:2R` (where the mesh has an even node count), `zeropp`,
//! `paro-igg`, `paro-iig`, `paro-nig`, and `frontier-topo` on meshes with packages.

use crate::config::{Factor, GradSync, Mesh, Strategy};

/// Why AMSP's filters reject `(p, g, os)` on `mesh` (eqs 3-7, `s_g ∈ {s_p, s_os}`), or
/// `None` when the triple passes.
pub fn amsp_reject(p: Factor, g: Factor, os: Factor, mesh: Mesh) -> Option<String> {
    let (r, n) = (mesh.ranks_per_node, mesh.nodes);
    for (name, f) in [("p", p), ("g", g), ("os", os)] {
        if f.intra == 0 || f.inter == 0 {
            return Some(format!("{name}={f}: factors are >= 1"));
        }
        if r % f.intra != 0 || f.intra > r {
            return Some(format!(
                "{name}={f}: {} does not divide s_dp⁰ = {r} (eq. 5)",
                f.intra
            ));
        }
        if n % f.inter != 0 || f.inter > n {
            return Some(format!(
                "{name}={f}: {} does not divide s_dp¹ = {n} (eq. 6)",
                f.inter
            ));
        }
        if f.inter > 1 && f.intra != r {
            return Some(format!(
                "{name}={f}: spans {} nodes with {} < {r} ranks per node (eq. 7)",
                f.inter, f.intra
            ));
        }
    }
    if !(p.intra <= g.intra && g.intra <= os.intra) {
        return Some(format!(
            "s_p⁰ <= s_g⁰ <= s_os⁰ broken: {p} {g} {os} (eq. 3)"
        ));
    }
    if !(p.inter <= g.inter && g.inter <= os.inter) {
        return Some(format!(
            "s_p¹ <= s_g¹ <= s_os¹ broken: {p} {g} {os} (eq. 4)"
        ));
    }
    if !(p.divides(g) && g.divides(os)) {
        return Some(format!(
            "shards do not nest: need p | g | os, got {p} {g} {os} (dependency rule, AMSP §IV-B)"
        ));
    }
    if g != p && g != os {
        return Some(format!(
            "s_g = {g} is neither s_p = {p} nor s_os = {os} (AMSP §IV-C3)"
        ));
    }
    None
}

/// Every factor `a x b` that passes eqs 5-7 on `mesh`, in (inter, intra) order.
pub fn amsp_factors(mesh: Mesh) -> Vec<Factor> {
    let (r, n) = (mesh.ranks_per_node, mesh.nodes);
    let mut v = Vec::new();
    for b in (1..=n).filter(|b| n % b == 0) {
        for a in (1..=r).filter(|a| r % a == 0) {
            if b > 1 && a != r {
                continue;
            }
            v.push(Factor::new(a, b));
        }
    }
    v
}

/// AMSP's candidate triples `(p, g, os)` on `mesh` (module doc), in a fixed order.
pub fn amsp_triples(mesh: Mesh) -> Vec<(Factor, Factor, Factor)> {
    let fs = amsp_factors(mesh);
    let mut out = Vec::new();
    for &p in &fs {
        for &os in &fs {
            for g in [p, os] {
                if amsp_reject(p, g, os, mesh).is_none() && !out.contains(&(p, g, os)) {
                    out.push((p, g, os));
                }
            }
        }
    }
    out
}

/// The AMSP strategy `amsp:p=..,g=..,os=..` (all-reduce sync, `auto` algorithms).
pub fn amsp_strategy(p: Factor, g: Factor, os: Factor) -> Strategy {
    let mut s = Strategy::custom(&format!("amsp:p={p},g={g},os={os}"), p, g, os);
    s.sync = GradSync::AllReduce;
    s
}

/// Every candidate: the AMSP triples, then the presets valid on `mesh`, each with
/// `accum` micro-batches per step.
pub fn candidates(mesh: Mesh, accum: usize) -> Vec<Strategy> {
    let mut v: Vec<Strategy> = amsp_triples(mesh)
        .into_iter()
        .map(|(p, g, os)| amsp_strategy(p, g, os))
        .collect();
    let r = mesh.ranks_per_node;
    let mut presets: Vec<String> = [
        "dp", "zero1", "zero2", "zero3", "zeropp", "paro-igg", "paro-iig", "paro-nig",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    presets.insert(4, format!("mics:{r}"));
    if mesh.nodes >= 2 {
        presets.insert(5, format!("mics:{}", 2 * r));
    }
    if mesh.ranks_per_package > 1 {
        presets.push("frontier-topo".into());
    }
    for name in presets {
        if let Ok(s) = Strategy::parse(&name, mesh) {
            v.push(s);
        }
    }
    for s in &mut v {
        s.accum = accum.max(1);
    }
    v
}
