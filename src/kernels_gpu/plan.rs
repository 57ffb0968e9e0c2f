//! Launch geometry and the kernel argument blocks, in plain Rust (tested without a GPU).
//!
//! A *group* of `gs` threads quantizes one quantization block (kernels-cuda/
//! strata_quant.cuh): each thread takes chunks of 16 (int8) or 32 (int4) elements, whose
//! codes fill 16 bytes, and keeps 32 values in registers between the amax and the
//! quantize passes, so `gs = next_pow2(ceil(block / 32))` (at most 512) reads each block
//! once up to 16384 elements (larger blocks re-read their tail, usually from L2). A
//! thread block runs `max(gs, 256)` threads, i.e.
//! `max(1, 256 / gs)` groups, in a grid-stride loop over all quantization blocks.

#![forbid(unsafe_code)]

use crate::kernels::QuantSpec;

/// Threads of a thread block when a group is smaller than that.
pub const CTA_THREADS: u32 = 256;
/// Largest group (threads per quantization block) and thread block: `STRATA_MAX_THREADS`
/// of the header (512 keeps 128 registers per thread, so the cached values never spill).
pub const MAX_GROUP: u32 = 512;
/// Largest grid; the kernels' grid-stride loop covers the rest.
pub const MAX_GRID: u32 = 1 << 16;

/// Threads per quantization block for `spec`: a power of two in 1..=512.
pub fn group_size(spec: QuantSpec) -> u32 {
    let ch = if spec.bits == 8 { 16 } else { 32 };
    let k = 32 / ch; // chunks a thread keeps in registers
    let chunks = spec.block.max(1).div_ceil(ch);
    let per_thread = chunks.div_ceil(k);
    (per_thread.next_power_of_two() as u64).min(MAX_GROUP as u64) as u32
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
    /// The launch for `total_blocks` quantization blocks of `spec`; `None` when there is
    /// nothing to do (a valid empty problem: n = 0, c = 0 or no slices).
    pub fn new(spec: QuantSpec, total_blocks: u64) -> Option<Launch> {
        if total_blocks == 0 {
            return None;
        }
        let gs = group_size(spec);
        let threads = gs.max(CTA_THREADS);
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
pub fn quantize_plan(
    spec: QuantSpec,
    c: usize,
    nodes: usize,
    devices: usize,
    stages: usize,
) -> Option<(Launch, QuantArgs)> {
    let l = Launch::new(spec, swizzle_blocks(spec, c, nodes, devices, stages)?)?;
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
    n: usize,
    k: usize,
    div: Option<f32>,
) -> Option<(Launch, DequantArgs)> {
    let l = Launch::new(spec, spec.blocks(n) as u64)?;
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
pub fn drq_plan(spec: QuantSpec, n: usize, slices: usize, k: usize) -> Option<(Launch, DrqArgs)> {
    let blocks = (spec.blocks(n) as u64).checked_mul(slices as u64)?;
    let l = Launch::new(spec, blocks)?;
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

    #[test]
    fn group_sizes() {
        assert_eq!(group_size(spec(8, 1)), 1);
        assert_eq!(group_size(spec(8, 32)), 1);
        assert_eq!(group_size(spec(8, 33)), 2);
        assert_eq!(group_size(spec(4, 64)), 2);
        assert_eq!(group_size(spec(8, 256)), 8);
        assert_eq!(group_size(spec(8, 2048)), 64);
        assert_eq!(group_size(spec(4, 2048)), 64);
        assert_eq!(group_size(spec(8, 16384)), 512);
        assert_eq!(group_size(spec(8, 32768)), 512);
        assert_eq!(group_size(spec(8, 1 << 20)), 512);
        for b in [1, 2, 3, 100, 1000, 4097, 1 << 20] {
            let g = group_size(spec(8, b));
            assert!(g.is_power_of_two() && g <= MAX_GROUP);
        }
    }

    #[test]
    fn launches_cover_every_block() {
        assert_eq!(Launch::new(spec(8, 256), 0), None);
        let l = Launch::new(spec(8, 256), 1000).unwrap();
        assert_eq!((l.threads, l.gs), (256, 8));
        assert_eq!(l.grid, 1000u64.div_ceil(32) as u32);
        let l = Launch::new(spec(4, 1 << 20), 3).unwrap();
        assert_eq!((l.threads, l.gs, l.grid), (512, 512, 3));
        let l = Launch::new(spec(8, 2), u64::MAX / 2).unwrap();
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
