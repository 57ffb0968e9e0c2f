//! The model beside published measurements: nccl-tests bus bandwidths on DGX A100 /
//! H100 clusters and the paper ratios strata's algorithms come from (MiCS Fig. 13a,
//! PaRO §4.2), each row with its source. `strata-sim --fidelity` prints [`rows`] as the
//! table of `docs/model-fidelity.md`, and `tests/fidelity.rs` holds the model to it.
//!
//! Which published figures set the model and which test it: the presets' link
//! efficiencies ([`crate::topology::presets`]) come from the one-node figures and the
//! single-NIC figures; every multi-node row is then a prediction of the channel-ring
//! model ([`crate::topology::channels`]), not a fit. [`Row::calibrates`] marks the rows
//! that are inputs.

#![forbid(unsafe_code)]

use super::{bus_factor, symmetric_makespan, Call};
use crate::algo::Algo;
use crate::dtype::DataType;
use crate::error::Result;
use crate::kinds::Kind;
use crate::topology::Topology;

/// What a row compares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Measure {
    /// nccl-tests bus bandwidth of `ring` (NCCL's rings) in GB/s.
    BusBw,
    /// Modeled time of `algo` over modeled time of `ring`, against the paper's ratio.
    RatioToRing(Algo),
}

/// One published figure and the model's value for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Topology SPEC (or a description of the topology built for the row).
    pub cluster: String,
    pub kind: Kind,
    /// nccl-tests `size` (bytes of the larger buffer).
    pub bytes: u64,
    pub measure: Measure,
    /// The published figure (GB/s, or a time ratio).
    pub published: f64,
    pub modeled: f64,
    /// Where the figure is published and what exactly it measured.
    pub source: &'static str,
    /// True when the figure set one of the model's inputs (so the row agrees by
    /// construction and tests nothing but the arithmetic).
    pub calibrates: bool,
}

impl Row {
    /// modeled / published.
    pub fn ratio(&self) -> f64 {
        self.modeled / self.published
    }
}

const A100_1: &str = "NVIDIA/nccl#1048 (and nccl-tests#175): all_reduce_perf -g 8 up to 4 GB on \
one 8x A100 SXM node, 232.54 GB/s; nccl-tests PERFORMANCE.md: bus bandwidth is the \
per-link figure for every op";
const A100_N: &str = "NVIDIA/nccl#812, NCCL maintainer: \"On an Nvidia DGX-A100 system we have \
8x200Gbit/s IB cards and we measure 192GB/s AllReduce BusBW\" (ring, beyond two nodes)";
const H100_1: &str = "NVIDIA/nccl-tests#212, NCCL maintainer: effective NVLink bandwidth of \
370GB/s as busbw for non-all-reduce ops or all-reduce with NCCL_ALGO=RING";
const H100_N: &str = "NVIDIA/nccl-tests#290, NCCL maintainer: \"For NDR @ 400Gbps you should see \
46-48GB/s per NIC\"; x 8 rails = 368-384 (376 taken); nccl-tests#309 (NVIDIA): 8x400G \
peak 400, above 380 only with NCCL_MIN_CTAS=24";
const A100_4NIC_2: &str = "NVIDIA/nccl-tests#100: 2 HGX A100 nodes, 4x ConnectX-6 HDR each, \
all_reduce_perf 1G-8G, 91 GB/s busbw";
const A100_4NIC_3: &str = "NVIDIA/nccl-tests#119: 3 nodes of 8x A100 SXM4 + 4x HDR, \
all_reduce_perf up to 128M, peak 96 GB/s (average 84.8)";
const MICS: &str = "MiCS (003) §5.1.5 Fig. 13a: 2 p3dn.24xlarge, hierarchical all-gather \
takes 72.1% of the time of vanilla all-gather at 128 MB";
const PARO: &str = "PaRO (001) §4.2: 2 DGX nodes, all-gather of 100 GB, ring 459 ms vs \
HO-Ring 309 ms (0.673)";

/// The DGX A100 preset with 4 HDR NICs per node instead of 8 (the HGX A100 systems of
/// nccl-tests#100 and #119, and AMSP's A800 testbed: 4 HDR per node).
pub fn a100_4nic(nodes: usize) -> Topology {
    let mut t = Topology::parse(&format!("dgx-a100:{nodes}")).expect("preset");
    t.links.nics_per_node = 4;
    t.links.inter_node.bandwidth_gbs = 4.0 * t.links.nic_bandwidth_gbs / 8.0;
    t.name = format!("dgx-a100:{nodes} with 4 HDR NICs");
    t
}

/// PaRO's testbed as its §3.3 describes it: 2 nodes of 8 A100 on NVSwitch whose
/// cross-machine bandwidth is "10~18GB/s" for one GPU and "nearly 56GB/s" for 8 GPUs at
/// once: modeled as 4 NICs of 14 GB/s per node (one GPU 14, all 8 together 56).
pub fn paro_testbed() -> Topology {
    let mut t = Topology::parse("dgx-a100:2").expect("preset");
    t.links.nics_per_node = 4;
    t.links.nic_bandwidth_gbs = 14.0;
    t.links.inter_node.bandwidth_gbs = 4.0 * 14.0 / 8.0;
    t.name = "PaRO testbed (2 x 8 A100, 56 GB/s per node)".into();
    t
}

/// Modeled time (us) of `algo` for `kind` with nccl-tests size `bytes` of f32 on `topo`
/// (exact node-symmetric replay).
pub fn time_us(topo: &Topology, kind: Kind, algo: Algo, bytes: u64) -> Result<f64> {
    let p = topo.world_size().max(1);
    let elems = (bytes / 4) as usize;
    let count = match kind {
        Kind::AllReduce => elems / p * p,
        _ => elems / p,
    };
    Ok(symmetric_makespan(&Call::new(topo, kind, algo, count, DataType::F32))?.1)
}

/// nccl-tests bus bandwidth (GB/s) of `ring` for `kind` of `bytes` on `topo`.
pub fn ring_busbw(topo: &Topology, kind: Kind, bytes: u64) -> Result<f64> {
    let t = time_us(topo, kind, Algo::Ring, bytes)?;
    Ok(bytes as f64 / (t * 1e3) * bus_factor(kind, topo.world_size()))
}

/// Every row (module doc). Bus bandwidths at 4 GiB, the largest size of the cited runs.
pub fn rows() -> Result<Vec<Row>> {
    const G4: u64 = 4 << 30;
    let mut out = Vec::new();
    let kinds = [Kind::AllGather, Kind::ReduceScatter, Kind::AllReduce];
    let dgx: [(&str, f64, &str, f64, &str); 2] = [
        ("dgx-a100", 232.54, A100_1, 192.0, A100_N),
        ("dgx-h100", 370.0, H100_1, 376.0, H100_N),
    ];
    for (name, one, src_one, many, src_many) in dgx {
        for nodes in [1usize, 2, 16] {
            let topo = Topology::parse(&format!("{name}:{nodes}"))?;
            for kind in kinds {
                let (published, source) = if nodes == 1 {
                    (one, src_one)
                } else {
                    (many, src_many)
                };
                out.push(Row {
                    cluster: topo.name.clone(),
                    kind,
                    bytes: G4,
                    measure: Measure::BusBw,
                    published,
                    modeled: ring_busbw(&topo, kind, G4)?,
                    source,
                    calibrates: nodes == 1 || name == "dgx-h100",
                });
            }
        }
    }
    for (nodes, published, source) in [(2, 91.0, A100_4NIC_2), (3, 96.0, A100_4NIC_3)] {
        let topo = a100_4nic(nodes);
        out.push(Row {
            cluster: topo.name.clone(),
            kind: Kind::AllReduce,
            bytes: if nodes == 2 { G4 } else { 128 << 20 },
            measure: Measure::BusBw,
            published,
            modeled: ring_busbw(
                &topo,
                Kind::AllReduce,
                if nodes == 2 { G4 } else { 128 << 20 },
            )?,
            source,
            calibrates: false,
        });
    }
    let ratio_on = |t: &Topology, algo: Algo, bytes: u64| -> Result<f64> {
        Ok(time_us(t, Kind::AllGather, algo, bytes)?
            / time_us(t, Kind::AllGather, Algo::Ring, bytes)?)
    };
    let ratio = |spec: &str, algo: Algo, bytes: u64| ratio_on(&Topology::parse(spec)?, algo, bytes);
    out.push(Row {
        cluster: "p3dn:2".into(),
        kind: Kind::AllGather,
        bytes: 128 << 20,
        measure: Measure::RatioToRing(Algo::Hier),
        published: 0.721,
        modeled: ratio("p3dn:2", Algo::Hier, 128 << 20)?,
        source: MICS,
        calibrates: false,
    });
    out.push(Row {
        cluster: "dgx-a100:2".into(),
        kind: Kind::AllGather,
        bytes: G4,
        measure: Measure::RatioToRing(Algo::HoRing),
        published: 309.0 / 459.0,
        modeled: ratio("dgx-a100:2", Algo::HoRing, G4)?,
        source: PARO,
        calibrates: false,
    });
    let paro = paro_testbed();
    out.push(Row {
        cluster: paro.name.clone(),
        kind: Kind::AllGather,
        bytes: G4,
        measure: Measure::RatioToRing(Algo::HoRing),
        published: 309.0 / 459.0,
        modeled: ratio_on(&paro, Algo::HoRing, G4)?,
        source: PARO,
        calibrates: false,
    });
    Ok(out)
}

/// [`rows`] as the markdown table of `docs/model-fidelity.md`.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "| cluster | op | size | measure | published | modeled | modeled/published | role | source |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let size = if r.bytes >= 1 << 30 {
            format!("{} GiB", r.bytes >> 30)
        } else {
            format!("{} MiB", r.bytes >> 20)
        };
        let (measure, published, modeled, cmp) = match r.measure {
            Measure::BusBw => (
                "ring busbw GB/s".to_string(),
                format!("{:.1}", r.published),
                format!("{:.1}", r.modeled),
                format!("{:.2}", r.ratio()),
            ),
            Measure::RatioToRing(a) => (
                format!("{a} time / ring time"),
                format!("{:.3}", r.published),
                format!("{:.3}", r.modeled),
                format!("{:+.1} pp", (r.modeled - r.published) * 100.0),
            ),
        };
        s.push_str(&format!(
            "| {} | {} | {size} | {measure} | {published} | {modeled} | {cmp} | {} | {} |\n",
            r.cluster,
            r.kind.name(),
            if r.calibrates {
                "calibration"
            } else {
                "prediction"
            },
            r.source
        ));
    }
    s
}
