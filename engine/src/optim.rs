//! Sharded AdamW (Loshchilov & Hutter, decoupled weight decay) on a rank's
//! optimizer-state shard: fp32 master weights and both moments, 12 bytes per element
//! (the `12Φ/s_os` of AMSP §IV-D, PaRO Table 1's `KΨ/N` with K = 12).

use serde::{Deserialize, Serialize};

/// AdamW hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamW {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
}

impl Default for AdamW {
    fn default() -> AdamW {
        AdamW {
            lr: 3e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

impl AdamW {
    /// One update of step `t` (1-based) on `master` with moments `m`, `v` from the
    /// averaged gradient `g`; all four slices have the same length. Element-wise, so a
    /// shard updates exactly as the same elements of the unsharded tensor would.
    pub fn update(&self, t: u64, master: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32]) {
        let t = t.max(1) as i32;
        let bc1 = 1.0 - self.beta1.powi(t);
        let bc2 = 1.0 - self.beta2.powi(t);
        for i in 0..master.len().min(g.len()).min(m.len()).min(v.len()) {
            let gi = g[i];
            m[i] = self.beta1 * m[i] + (1.0 - self.beta1) * gi;
            v[i] = self.beta2 * v[i] + (1.0 - self.beta2) * gi * gi;
            let mh = m[i] / bc1;
            let vh = v[i] / bc2;
            master[i] -= self.lr * (mh / (vh.sqrt() + self.eps) + self.weight_decay * master[i]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_update_equals_whole_update() {
        let o = AdamW::default();
        let g: Vec<f32> = (0..10).map(|i| (i as f32 - 4.5) * 0.1).collect();
        let (mut w, mut m, mut v) = (vec![0.5f32; 10], vec![0f32; 10], vec![0f32; 10]);
        let (mut w2, mut m2, mut v2) = (w.clone(), m.clone(), v.clone());
        o.update(1, &mut w, &mut m, &mut v, &g);
        o.update(1, &mut w2[..4], &mut m2[..4], &mut v2[..4], &g[..4]);
        o.update(1, &mut w2[4..], &mut m2[4..], &mut v2[4..], &g[4..]);
        assert_eq!(w, w2);
        // g[0] < 0: the weight moves up by about lr (Adam's first step is ~lr·sign(g)).
        assert!(w[0] > 0.5 && w[0] < 0.5 + 0.01, "{}", w[0]);
    }
}
