//! Launch geometry and the kernel argument blocks, in plain Rust (tested without a GPU).
//!
//! A *group* of `gs` threads quantizes (or dequantizes) one quantization block
//! (kernels-cuda/strata_quant.cuh). Its lanes take *vectors* of 16 bytes of the kernel's
//! input (quantizers: 4 f32 or 8 f16/bf16 elements; the fused kernel: 16 codes) or of its
//! output (dequantizers: 4 f32 or 8 f16/bf16 elements). Lane t holds vectors t, t + gs,
//! t + 2·gs, … in registers, a number fixed per kernel by [`Geometry`] (quantizers: 16,
//! i.e. 64 f32 or 128 bf16 elements by default), so
//! `gs = next_pow2(ceil(block / (vectors·EPV)))` (at most 512) reads each block once: a
//! 2048-element f32 block is one warp, every lane issuing its 16 loads of 16 bytes before
//! the block's amax reduction. A thread block runs `max(gs, cta_threads)` threads in a
//! grid-stride loop over all quantization blocks.

#![forbid(unsafe_code)]

use crate::kernels::QuantSpec;
use crate::DataType;

/// Largest group (threads per quantization block) and thread block: `STRATA_MAX_THREADS`
/// of the header (512 keeps 128 registers per thread, so the cached values never spill).
pub const MAX_GROUP: u32 = 512;
/// Largest grid; the kernels' grid-stride loop covers the rest.
pub const MAX_GRID: u32 = 1 << 16;

/// The kernels' register geometry: elements each lane keeps in registers (compiled into
/// the CUDA module as `STRATA_LANE_ELEMS`) and threads per thread block. Any geometry
/// gives the same bytes (the kernels loop over what does not fit); it only sets speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Elements per lane: 16, 32 or 64.
    pub lane_elems: u32,
    /// Threads per thread block when a group is smaller: 128, 256 or 512.
    pub cta_threads: u32,
}

impl Geometry {
    /// What the kernels are built and launched with unless `STRATA_KERNEL_GEOMETRY` says
    /// otherwise (the HIP code objects are built with it).
    pub const DEFAULT: Geometry = Geometry {
        lane_elems: 64,
        cta_threads: 256,
    };

    /// `"E,T"` (elements per lane, threads per thread block), e.g. `"32,512"`.
    pub fn parse(s: &str) -> crate::Result<Geometry> {
        let bad = || {
            crate::Error::InvalidArgument(format!(
                "kernel geometry {s:?}: expected \"E,T\" with E in 16, 32, 64 (elements per \
                 lane) and T in 128, 256, 512 (threads per thread block)"
            ))
        };
        let (e, t) = s.split_once(',').ok_or_else(bad)?;
        let e: u32 = e.trim().parse().map_err(|_| bad())?;
        let t: u32 = t.trim().parse().map_err(|_| bad())?;
        if ![16, 32, 64].contains(&e) || ![128, 256, 512].contains(&t) {
            return Err(bad());
        }
        Ok(Geometry {
            lane_elems: e,
            cta_threads: t,
        })
    }

    /// The process's geometry: `STRATA_KERNEL_GEOMETRY` (read once; for measuring other
    /// geometries, `strata-gpu-check --tune`), else [`Geometry::DEFAULT`]. A malformed
    /// value is reported once and ignored.
    pub fn current() -> Geometry {
        static G: std::sync::OnceLock<Geometry> = std::sync::OnceLock::new();
        *G.get_or_init(|| match std::env::var("STRATA_KERNEL_GEOMETRY") {
            Ok(v) => Geometry::parse(&v).unwrap_or_else(|e| {
                tracing::warn!("STRATA_KERNEL_GEOMETRY ignored: {e}");
                Geometry::DEFAULT
            }),
            Err(_) => Geometry::DEFAULT,
        })
    }
}

impl Geometry {
    /// 16-byte vectors of input a lane of a quantizer holds (`STRATA_QUANT_VECS`): 64
    /// f32 or 128 f16/bf16 elements by default.
    pub fn quant_vecs(self) -> u32 {
        (self.lane_elems / 4).max(1)
    }

    /// Vectors of 16 codes a lane of the fused dequantize-reduce-quantize holds
    /// (`STRATA_DRQ_VECS`): its f32 sums and the codes of 4 senders share the registers.
    pub fn drq_vecs(self) -> u32 {
        (self.lane_elems / 32).max(1)
    }

    /// 16-byte output vectors of `dtype` a lane of a dequantizer holds: half of
    /// `lane_elems` elements for one sender without a division (`one`:
    /// `strata_dequantize_*`), a quarter otherwise (`strata_dequant_reduce_*`: its sums
    /// and four senders' codes).
    pub fn deq_vecs(self, dtype: DataType, one: bool) -> u32 {
        let elems = if one {
            self.lane_elems / 2
        } else {
            self.lane_elems / 4
        };
        (elems / vec_elems(dtype)).max(1)
    }
}

/// Whether a dequantize-reduce runs as `strata_dequantize_*` (one sender, no division)
/// rather than `strata_dequant_reduce_*`: the launch's geometry and its kernel follow it.
pub fn one_sender(k: usize, div: Option<f32>) -> bool {
    k == 1 && div.is_none()
}

/// Elements per 16-byte vector of an element type (f32: 4; f16, bf16: 8).
pub fn vec_elems(dtype: DataType) -> u32 {
    (16 / dtype.size()) as u32
}

/// Elements per vector of packed codes (dequantization and the fused kernel): 16 (16
/// bytes of int8 codes, 8 of int4).
pub const CODE_VEC: u32 = 16;

/// Threads per quantization block for `spec` with vectors of `epv` elements, a lane
/// holding `vecs` of them: a power of two in 1..=512.
pub fn group_size(spec: QuantSpec, epv: u32, vecs: u32) -> u32 {
    let per_lane = vecs.max(1) as usize * epv as usize;
    let lanes = spec.block.max(1).div_ceil(per_lane);
    (lanes.next_power_of_two() as u64).min(MAX_GROUP as u64) as u32
}

/// One launch: `grid` thread blocks of `threads` threads, groups of `gs` threads, over
/// `total_blocks` quantization blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    pub grid: u32,
    pub threads: u32,
    pub gs: u32,
    pub total_blocks: u64,
}

impl Launch {
    /// The launch for `total_blocks` quantization blocks of `spec` in vectors of `epv`
    /// elements, `vecs` a lane, thread blocks of `g`; `None` when there is nothing to do (a valid empty problem: n = 0, c = 0
    /// or no slices).
    pub fn new(
        spec: QuantSpec,
        epv: u32,
        vecs: u32,
        total_blocks: u64,
        g: Geometry,
    ) -> Option<Launch> {
        if total_blocks == 0 {
            return None;
        }
        let gs = group_size(spec, epv, vecs);
        let threads = gs.max(g.cta_threads);
        let groups = (threads / gs) as u64;
        let grid = total_blocks.div_ceil(groups).min(MAX_GRID as u64) as u32;
        Some(Launch {
            grid,
            threads,
            gs,
            total_blocks,
        })
    }
}

/// Quantization blocks of a swizzled quantization (plain quantization of `slices` slices
/// of n elements is nodes = 1, devices = slices, c = n, stages = 1):
/// `Σ_s p·blocks(|c_s|)`. `None` on overflow.
pub fn swizzle_blocks(
    spec: QuantSpec,
    c: usize,
    nodes: usize,
    devices: usize,
    stages: usize,
) -> Option<u64> {
    if stages == 0 {
        return Some(0);
    }
    let p = (nodes as u64).checked_mul(devices as u64)?;
    let (q, rem) = ((c / stages) as u64, (c % stages) as u64);
    let nb_long = spec.blocks(q as usize + 1) as u64;
    let nb_short = spec.blocks(q as usize) as u64;
    let long = rem.checked_mul(p)?.checked_mul(nb_long)?;
    let short = (stages as u64 - rem)
        .checked_mul(p)?
        .checked_mul(nb_short)?;
    long.checked_add(short)
}

/// Arguments of `strata_quantize_*` (`StrataQuantArgs` in the header; same layout).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuantArgs {
    pub input: u64,
    pub out: u64,
    pub block: u64,
    pub nodes: u64,
    pub devices: u64,
    pub chunk: u64,
    pub stages: u64,
    pub total_blocks: u64,
    pub gs: u32,
    pub pad: u32,
}

/// Arguments of `strata_dequant_reduce_*` (`StrataDequantArgs`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DequantArgs {
    pub input: u64,
    pub out: u64,
    pub block: u64,
    pub n: u64,
    pub slices: u64,
    pub k: u64,
    pub in_stride: u64,
    pub total_blocks: u64,
    pub gs: u32,
    pub avg: u32,
    pub divisor: f32,
    pub pad: u32,
}

/// Arguments of `strata_dequant_reduce_quant_*` (`StrataDrqArgs`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrqArgs {
    pub input: u64,
    pub out: u64,
    pub block: u64,
    pub n: u64,
    pub slices: u64,
    pub k: u64,
    pub in_stride: u64,
    pub total_blocks: u64,
    pub gs: u32,
    pub pad: u32,
}

/// Launch and arguments (device pointers left 0) of a swizzled quantization whose sizes
/// were validated; `None` for an empty problem.
#[allow(clippy::too_many_arguments)]
pub fn quantize_plan(
    spec: QuantSpec,
    dtype: DataType,
    c: usize,
    nodes: usize,
    devices: usize,
    stages: usize,
    g: Geometry,
) -> Option<(Launch, QuantArgs)> {
    let blocks = swizzle_blocks(spec, c, nodes, devices, stages)?;
    let l = Launch::new(spec, vec_elems(dtype), g.quant_vecs(), blocks, g)?;
    let a = QuantArgs {
        input: 0,
        out: 0,
        block: spec.block as u64,
        nodes: nodes as u64,
        devices: devices as u64,
        chunk: c as u64,
        stages: stages as u64,
        total_blocks: l.total_blocks,
        gs: l.gs,
        pad: 0,
    };
    Some((l, a))
}

/// Launch and arguments of a dequantize-reduce of k senders' single slices of n elements
/// (`div`: the avg divisor as f32); `None` for n = 0.
pub fn dequant_plan(
    spec: QuantSpec,
    dtype: DataType,
    n: usize,
    k: usize,
    div: Option<f32>,
    g: Geometry,
) -> Option<(Launch, DequantArgs)> {
    let l = Launch::new(
        spec,
        vec_elems(dtype),
        g.deq_vecs(dtype, one_sender(k, div)),
        spec.blocks(n) as u64,
        g,
    )?;
    let a = DequantArgs {
        input: 0,
        out: 0,
        block: spec.block as u64,
        n: n as u64,
        slices: 1,
        k: k as u64,
        in_stride: spec.packed_len(n) as u64,
        total_blocks: l.total_blocks,
        gs: l.gs,
        avg: u32::from(div.is_some()),
        divisor: div.unwrap_or(1.0),
        pad: 0,
    };
    Some((l, a))
}

/// Launch and arguments of a fused dequantize-reduce-quantize of k senders, each `slices`
/// slices of n elements; `None` when empty.
pub fn drq_plan(
    spec: QuantSpec,
    n: usize,
    slices: usize,
    k: usize,
    g: Geometry,
) -> Option<(Launch, DrqArgs)> {
    let blocks = (spec.blocks(n) as u64).checked_mul(slices as u64)?;
    let l = Launch::new(spec, CODE_VEC, g.drq_vecs(), blocks, g)?;
    let a = DrqArgs {
        input: 0,
        out: 0,
        block: spec.block as u64,
        n: n as u64,
        slices: slices as u64,
        k: k as u64,
        in_stride: (spec.packed_len(n) * slices) as u64,
        total_blocks: l.total_blocks,
        gs: l.gs,
        pad: 0,
    };
    Some((l, a))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::swizzle_ranges;

    fn spec(bits: u32, block: usize) -> QuantSpec {
        QuantSpec::new(bits, block).unwrap()
    }

    const G: Geometry = Geometry::DEFAULT;

    #[test]
    fn group_sizes() {
        let q = G.quant_vecs();
        // f32 (4 per vector, 16 vectors a lane: 64 elements a lane).
        assert_eq!(group_size(spec(8, 1), 4, q), 1);
        assert_eq!(group_size(spec(8, 64), 4, q), 1);
        assert_eq!(group_size(spec(8, 65), 4, q), 2);
        assert_eq!(group_size(spec(8, 256), 4, q), 4);
        // 2048 elements: one warp for f32, half a warp for bf16 (128 a lane).
        assert_eq!(group_size(spec(8, 2048), 4, q), 32);
        assert_eq!(group_size(spec(4, 2048), 8, q), 16);
        // The fused kernel holds 32 a lane; dequantization 32 (one sender, Sum) or 16.
        assert_eq!(group_size(spec(8, 2048), CODE_VEC, G.drq_vecs()), 64);
        assert_eq!(group_size(spec(4, 2048), CODE_VEC, G.drq_vecs()), 64);
        assert_eq!(
            group_size(spec(8, 2048), 4, G.deq_vecs(DataType::F32, true)),
            64
        );
        assert_eq!(
            group_size(spec(8, 2048), 8, G.deq_vecs(DataType::BF16, true)),
            64
        );
        assert_eq!(
            group_size(spec(8, 2048), 4, G.deq_vecs(DataType::F32, false)),
            128
        );
        assert_eq!(group_size(spec(8, 32768), 4, q), 512);
        assert_eq!(group_size(spec(8, 1 << 20), 4, q), 512);
        // The smallest geometry: at least one vector a lane.
        let small = Geometry::parse("16,128").unwrap();
        assert_eq!(small.drq_vecs(), 1);
        assert_eq!(
            group_size(spec(8, 2048), 8, small.deq_vecs(DataType::BF16, false)),
            256
        );
        for b in [1, 2, 3, 100, 1000, 4097, 1 << 20] {
            for epv in [4, 8, 16] {
                for v in [1, 2, 4, 16] {
                    let g = group_size(spec(8, b), epv, v);
                    assert!(g.is_power_of_two() && g <= MAX_GROUP);
                }
            }
        }
    }

    #[test]
    fn geometry_parses_and_rejects() {
        assert_eq!(Geometry::parse("64,256").unwrap(), Geometry::DEFAULT);
        assert_eq!(
            Geometry::parse(" 32 , 512 ").unwrap(),
            Geometry {
                lane_elems: 32,
                cta_threads: 512,
            }
        );
        for bad in ["", "64", "64,", "48,256", "64,300", "x,256", "64,256,1"] {
            assert!(Geometry::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn launches_cover_every_block() {
        let e = G.quant_vecs();
        assert_eq!(Launch::new(spec(8, 256), 4, e, 0, G), None);
        let l = Launch::new(spec(8, 256), 4, e, 1000, G).unwrap();
        assert_eq!((l.threads, l.gs), (256, 4));
        assert_eq!(l.grid, 1000u64.div_ceil(64) as u32);
        let l = Launch::new(spec(4, 1 << 20), 8, e, 3, G).unwrap();
        assert_eq!((l.threads, l.gs, l.grid), (512, 512, 3));
        let l = Launch::new(spec(8, 2), 4, e, u64::MAX / 2, G).unwrap();
        assert_eq!(l.grid, MAX_GRID);
    }

    #[test]
    fn swizzle_blocks_match_the_ranges() {
        for (c, nodes, devices, stages, block) in [
            (0, 2, 3, 1, 4),
            (10, 1, 1, 1, 4),
            (10, 3, 2, 4, 4),
            (3, 2, 2, 5, 2),
            (1001, 3, 8, 3, 256),
        ] {
            let s = spec(8, block);
            let want: usize = swizzle_ranges(c, stages)
                .iter()
                .map(|r| nodes * devices * s.blocks(r.len()))
                .sum();
            assert_eq!(
                swizzle_blocks(s, c, nodes, devices, stages),
                Some(want as u64)
            );
        }
    }

    #[test]
    fn arg_layouts_match_the_header() {
        // StrataQuantArgs / StrataDrqArgs: 8 x 8 bytes + 2 x u32; StrataDequantArgs adds
        // avg, divisor and padding.
        assert_eq!(std::mem::size_of::<QuantArgs>(), 72);
        assert_eq!(std::mem::size_of::<DrqArgs>(), 72);
        assert_eq!(std::mem::size_of::<DequantArgs>(), 80);
        assert_eq!(std::mem::align_of::<DequantArgs>(), 8);
    }
}
