//! The time of strata's quantization kernels in a quantized collective (qwZ, qgZ), from
//! measured rates.
//!
//! A rate is what `strata-gpu-check` reports for a kernel at 64 Mi elements: bytes read
//! plus bytes written per second (GB/s, 1e9). A quantized collective's kernels, per rank,
//! with `c` elements of `w` bytes per rank, `P(c)` packed bytes per slice
//! (`docs/quantization.md`), a group of `a` ranks on each of `b` nodes, `p = a·b`:
//!
//! | collective | kernels (bytes read + written) |
//! |---|---|
//! | qwZ all-gather (ZeRO++ B.1) | quantize own shard (`c·w + P(c)`), dequantize the `p` gathered slices (`p·P(c) + p·c·w`) |
//! | qgZ reduce-scatter, 2 hops (ZeRO++ E.3) | swizzled quantize (`p·c·w + p·P(c)`), dequantize-reduce-quantize of `a` senders' `b` slices (`a·b·P(c) + b·P(c)`), dequantize-reduce of `b` senders (`b·P(c) + c·w`) |
//! | qgZ 1 hop | quantize (`p·c·w + p·P(c)`), dequantize-reduce of `p` senders (`p·P(c) + c·w`) |
//!
//! Each kernel's time is its bytes over its rate; the kernels of a collective run on the
//! rank's stream between its transfers, so their times add to the transfers' (the
//! model charges no overlap). [`KernelRates::h200`] holds the rates measured on an NVIDIA
//! H200 (`docs/kernels.md`, "GPU kernels"); another GPU's come from running
//! `strata-gpu-check` there (`strata-plan --kernel-rates FILE`).

use serde::{Deserialize, Serialize};

/// One kernel's measured rate for 8-bit and 4-bit codes, GB/s (bytes read + written).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Rate {
    pub q8: f64,
    pub q4: f64,
}

impl Rate {
    fn of(self, bits: u8) -> f64 {
        if bits == 4 {
            self.q4
        } else {
            self.q8
        }
    }
}

/// The element-side kernels' rates for one element width.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ElemRates {
    /// Swizzled (and plain) quantization, elements in.
    pub quantize: Rate,
    /// Dequantization of one sender, elements out.
    pub dequantize: Rate,
    /// Dequantize-reduce of k senders (qgZ's last step, Avg), elements out.
    pub dequant_reduce: Rate,
}

/// Measured rates of strata's quantization kernels on one GPU (module doc).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelRates {
    /// Where the figures come from (shown in reports).
    pub device: String,
    /// bf16/f16 elements (`w` = 2).
    pub w2: ElemRates,
    /// f32 elements (`w` = 4).
    pub w4: ElemRates,
    /// The fused dequantize-reduce-quantize (packed in, packed out: no element width).
    pub dequant_reduce_quant: Rate,
}

impl KernelRates {
    /// One NVIDIA H200, `strata-gpu-check` of 2026-11-28 (block 2048, 64 Mi elements;
    /// quantize as the swizzled 4x8x2 row, dequantize-reduce as the k = 4 Avg row, the
    /// fused kernel as k = 8 senders of 4 slices; docs/kernels.md).
    pub fn h200() -> KernelRates {
        KernelRates {
            device: "NVIDIA H200 (strata-gpu-check, 2026-11-28)".into(),
            w2: ElemRates {
                quantize: Rate {
                    q8: 3429.0,
                    q4: 2861.0,
                },
                dequantize: Rate {
                    q8: 2482.0,
                    q4: 2095.0,
                },
                dequant_reduce: Rate {
                    q8: 1163.0,
                    q4: 866.0,
                },
            },
            w4: ElemRates {
                quantize: Rate {
                    q8: 3938.0,
                    q4: 3599.0,
                },
                dequantize: Rate {
                    q8: 3279.0,
                    q4: 3114.0,
                },
                dequant_reduce: Rate {
                    q8: 1518.0,
                    q4: 993.0,
                },
            },
            dequant_reduce_quant: Rate {
                q8: 1988.0,
                q4: 1074.0,
            },
        }
    }

    /// Rates that make every kernel free (the model before kernels were counted).
    pub fn free() -> KernelRates {
        let inf = Rate {
            q8: f64::INFINITY,
            q4: f64::INFINITY,
        };
        let e = ElemRates {
            quantize: inf,
            dequantize: inf,
            dequant_reduce: inf,
        };
        KernelRates {
            device: "none (kernels not counted)".into(),
            w2: e,
            w4: e,
            dequant_reduce_quant: inf,
        }
    }

    /// Every rate positive (infinity allowed: a free kernel).
    pub fn validate(&self) -> std::result::Result<(), String> {
        let e = |n: &str, r: ElemRates| {
            [
                (format!("{n}.quantize"), r.quantize),
                (format!("{n}.dequantize"), r.dequantize),
                (format!("{n}.dequant_reduce"), r.dequant_reduce),
            ]
        };
        let all = e("w2", self.w2)
            .into_iter()
            .chain(e("w4", self.w4))
            .chain([(
                "dequant_reduce_quant".to_string(),
                self.dequant_reduce_quant,
            )]);
        for (name, r) in all {
            for (b, v) in [("q8", r.q8), ("q4", r.q4)] {
                if v.is_nan() || v <= 0.0 {
                    return Err(format!("kernel rate {name}.{b} must be > 0 GB/s, got {v}"));
                }
            }
        }
        Ok(())
    }

    fn elem(&self, w: usize) -> ElemRates {
        if w >= 4 {
            self.w4
        } else {
            self.w2
        }
    }

    /// Microseconds of one rank's quantization kernels in a quantized all-gather
    /// (`gather`) or reduce-scatter (`flat`: the 1-hop form) of `c` elements of `w`
    /// bytes per rank, `packed` = P(c) bytes, on a group of `a` ranks on each of `b`
    /// nodes (module doc table).
    #[allow(clippy::too_many_arguments)]
    pub fn collective_us(
        &self,
        gather: bool,
        flat: bool,
        c: u64,
        packed: u64,
        w: usize,
        bits: u8,
        a: u64,
        b: u64,
    ) -> f64 {
        let us = |bytes: u64, r: Rate| bytes as f64 / (r.of(bits) * 1e3);
        let e = self.elem(w);
        let (cw, p) = (c * w as u64, a * b);
        if gather {
            return us(cw + packed, e.quantize) + us(p * packed + p * cw, e.dequantize);
        }
        let quantize = us(p * cw + p * packed, e.quantize);
        if flat {
            return quantize + us(p * packed + cw, e.dequant_reduce);
        }
        quantize
            + us(a * b * packed + b * packed, self.dequant_reduce_quant)
            + us(b * packed + cw, e.dequant_reduce)
    }
}

impl Default for KernelRates {
    fn default() -> Self {
        KernelRates::h200()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_over_rates() {
        let r = KernelRates::h200();
        // qwZ of 1 Mi bf16 elements per rank, int8, 8 ranks on one node: 2 MiB + P in at
        // the quantizer's rate, 8 P + 16 MiB out at the dequantizer's.
        let (c, packed) = (1u64 << 20, (1u64 << 20) + 4 * 4096);
        let want = (2 * c + packed) as f64 / (3429.0 * 1e3)
            + (8 * packed + 8 * 2 * c) as f64 / (2482.0 * 1e3);
        let got = r.collective_us(true, false, c, packed, 2, 8, 8, 1);
        assert!((got - want).abs() < 1e-9, "{got} vs {want}");
        // qgZ's two hops on 4 nodes of 8 count the fused middle hop; one hop does not.
        let two = r.collective_us(false, false, c, packed, 2, 4, 8, 4);
        let one = r.collective_us(false, true, c, packed, 2, 4, 8, 4);
        let fused = (32 * packed + 4 * packed) as f64 / (1074.0 * 1e3);
        let last2 = (4 * packed + 2 * c) as f64 / (866.0 * 1e3);
        let last1 = (32 * packed + 2 * c) as f64 / (866.0 * 1e3);
        assert!((two - one - (fused + last2 - last1)).abs() < 1e-9);
        assert_eq!(
            KernelRates::free().collective_us(false, false, c, packed, 4, 8, 8, 4),
            0.0
        );
    }

    #[test]
    fn rates_are_checked_and_read_from_json() {
        assert!(KernelRates::h200().validate().is_ok());
        assert!(KernelRates::free().validate().is_ok());
        let mut r = KernelRates::h200();
        r.w4.dequantize.q4 = 0.0;
        let e = r.validate().unwrap_err();
        assert!(e.contains("w4.dequantize.q4"), "{e}");
        let json = serde_json::to_string(&KernelRates::h200()).unwrap();
        let back: KernelRates = serde_json::from_str(&json).unwrap();
        assert_eq!(back, KernelRates::h200());
    }
}
