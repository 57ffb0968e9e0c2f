//! A tiny seeded pseudo-random generator (SplitMix64) for parameter initialization and
//! the corpus: no global state, no thread-count dependence, the same stream on every
//! run and every machine (normal samples use `f64::ln`/`sqrt`/`cos`, which are
//! deterministic for a given platform's math library).

/// SplitMix64 (Steele, Lea & Flood 2014): a 64-bit state advanced by a Weyl constant and
/// scrambled by a bijective mixer. Fast, statistically good enough for initialization
/// and sampling text, and trivially reproducible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose stream is fully determined by `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.state)
    }

    /// A uniform sample in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform integer in `[0, n)`; `0` when `n == 0`. (Multiply-shift reduction; the
    /// bias is below 2^-32 for the small `n` used here.)
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    /// A standard normal sample (Box-Muller, cosine branch only, so each call consumes
    /// exactly two 64-bit draws and the stream position never depends on history).
    pub fn next_normal(&mut self) -> f64 {
        // u1 in (0, 1] so that ln(u1) is finite.
        let u1 = 1.0 - self.next_f64();
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// The SplitMix64 output mixer: a bijection on `u64` that scrambles every input bit into
/// every output bit. Also handy as a stateless hash of an index.
pub fn mix64(x: u64) -> u64 {
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
