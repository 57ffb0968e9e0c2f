//! The event loop both replays share ([`super::replay`], [`super::symmetric`]): transfers
//! in waves of equal ready time (symmetric schedules make large waves), a heap of
//! distinct times, each wave's transfers taken in index order.
#![forbid(unsafe_code)]

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// Runs a dependency graph of `indeg.len()` transfers to completion: `indeg[i]` is the
/// number of transfers `i` waits on, `list[start[i]..start[i + 1]]` its dependents (CSR).
/// `visit(i, ready)` runs transfer `i`, ready at `ready`, and returns its end; a
/// dependent is ready at the latest end of what it waits on. Returns (transfers run,
/// the latest end): fewer than all when some wait on a cycle.
pub(super) fn run(
    indeg: &mut [u32],
    start: &[u32],
    list: &[u32],
    mut visit: impl FnMut(u32, f64) -> f64,
) -> (usize, f64) {
    let n = indeg.len();
    let mut ready = vec![0.0f64; n];
    let mut heap: BinaryHeap<Ready> = BinaryHeap::new();
    let mut waves = Waves::default();
    let push = |waves: &mut Waves, heap: &mut BinaryHeap<Ready>, t: f64, i: u32| {
        let w = waves.entry(t.to_bits()).or_default();
        if w.is_empty() {
            heap.push(Ready(t, 0));
        }
        w.push(i);
    };
    for i in 0..n as u32 {
        if indeg[i as usize] == 0 {
            push(&mut waves, &mut heap, 0.0, i);
        }
    }
    let mut done = 0usize;
    let mut makespan = 0.0f64;
    let mut wave: Vec<u32> = Vec::new();
    while let Some(Ready(rt, _)) = heap.pop() {
        // Transfers made ready at this same time while the wave runs (after zero-cost
        // transfers only) form a further wave of the same time; the heap entry that
        // announced it is then stale and finds no wave.
        while let Some(mut w) = waves.remove(&rt.to_bits()) {
            w.sort_unstable();
            std::mem::swap(&mut wave, &mut w);
            for &i in &wave {
                let iu = i as usize;
                let end = visit(i, rt);
                if end > makespan {
                    makespan = end;
                }
                done += 1;
                for &d in &list[start[iu] as usize..start[iu + 1] as usize] {
                    let d = d as usize;
                    if end > ready[d] {
                        ready[d] = end;
                    }
                    indeg[d] -= 1;
                    if indeg[d] == 0 {
                        push(&mut waves, &mut heap, ready[d], d as u32);
                    }
                }
            }
            wave.clear();
        }
    }
    (done, makespan)
}

/// Heap entry: earliest time first (then lowest index).
#[derive(PartialEq)]
struct Ready(f64, u32);

impl Eq for Ready {}

impl Ord for Ready {
    fn cmp(&self, o: &Self) -> Ordering {
        o.0.total_cmp(&self.0).then_with(|| o.1.cmp(&self.1))
    }
}

impl PartialOrd for Ready {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// Fibonacci hashing of the bits of a ready time (the wave map's keys; SipHash would
/// dominate the replay).
#[derive(Default)]
struct TimeHasher(u64);

impl std::hash::Hasher for TimeHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (x ^ (x >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type Waves = HashMap<u64, Vec<u32>, std::hash::BuildHasherDefault<TimeHasher>>;
