//! The log-step step arithmetic both forms share (on a communicator, [`super::log_step`],
//! and straight on a host transport, [`super::log_step_host`]): Bruck's steps and their
//! chunk runs, the first step of a non-power-of-two reduce-scatter, and the step sizes of
//! recursive doubling / halving ([`super::recursive`]).

#![forbid(unsafe_code)]

/// The steps of the log-step all-gather over `p` ranks, in order: (d, m) = (step size,
/// chunks moved). Reduce-scatter runs them in reverse.
pub fn steps(p: usize) -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    let mut d = 1;
    while d < p {
        v.push((d, d.min(p - d)));
        d *= 2;
    }
    v
}

/// The last (largest) of [`steps`]`(p)`, without building the list: D, the largest
/// power of two below p (p > 1), and the chunks it moves, min(D, p − D).
pub(super) fn last_step(p: usize) -> (usize, usize) {
    let d = if p > 1 {
        1 << (usize::BITS - 1 - (p - 1).leading_zeros())
    } else {
        1
    };
    (d, d.min(p.saturating_sub(d)).max(1))
}

/// The chunk run [a, a+m) of a ring of p chunks as at most two contiguous (start, len)
/// runs, split where it wraps past chunk p − 1.
pub(super) fn runs(a: usize, m: usize, p: usize) -> impl Iterator<Item = (usize, usize)> {
    let first = m.min(p - a);
    [(a, first), (0, m - first)].into_iter().filter(|r| r.1 > 0)
}

/// Up to this many bytes of result (of input, for reduce-scatter) the flat log-step
/// collectives work in a rotated buffer (one message each way per step, a copy of the
/// whole); above it, without that copy (a run that wraps costs a second message,
/// which the MPI transport receives in a second phase). 64 KiB: at 256 KiB the copy
/// already cost 15-20% on 8 ranks sharing a host's memory, at 64 KiB the two forms
/// measured alike there (2026-11-27), and on four one-rank nodes sharing two cores the
/// rotated form took 1.13x Open MPI's time where the other took 1.20x (2026-11-30).
pub const ROTATE_UP_TO: usize = 64 << 10;

/// True when a flat log-step collective of `bytes` (result; input for reduce-scatter)
/// runs rotated ([`ROTATE_UP_TO`]).
pub fn rotates(bytes: usize) -> bool {
    bytes <= ROTATE_UP_TO
}

/// The reduce-scatter's largest step above [`ROTATE_UP_TO`] bytes of input, as byte
/// ranges (`log_step`'s `first_step_direct`, and the host path's): the runs of `send` it sends to
/// `dst` and of the work buffer (`work` bytes, D chunks) it receives from `src`, both
/// split where they wrap as the peer splits them; then how this rank's own chunks fill
/// the work buffer (work range, `send` range, reduced into what came or copied in).
pub(super) struct FirstStep {
    pub dst: usize,
    pub sends: Vec<std::ops::Range<usize>>,
    pub src: usize,
    pub recvs: Vec<std::ops::Range<usize>>,
    pub fill: Vec<(std::ops::Range<usize>, std::ops::Range<usize>, bool)>,
    pub work: usize,
}

impl FirstStep {
    /// Of rank `x` of `p` (p > 1), `c` bytes per chunk.
    pub(super) fn of(p: usize, x: usize, c: usize) -> FirstStep {
        let (big, first) = last_step(p);
        let bytes = |(a, m): (usize, usize)| a * c..(a + m) * c;
        let dst = (x + big) % p;
        // Consecutive work ranges of the given chunk counts.
        let packed = |ms: &mut dyn Iterator<Item = usize>| {
            let mut at = 0;
            ms.map(|m| {
                at += m * c;
                at - m * c..at
            })
            .collect::<Vec<_>>()
        };
        let recvs = packed(&mut runs(x, first, p).map(|r| r.1));
        let own: Vec<_> = runs(x, first, p)
            .map(|r| (r, true))
            .chain(runs((x + first) % p, big - first, p).map(|r| (r, false)))
            .collect();
        let fill = packed(&mut own.iter().map(|(r, _)| r.1))
            .into_iter()
            .zip(&own)
            .map(|(w, &(r, reduce))| (w, bytes(r), reduce))
            .collect();
        FirstStep {
            dst,
            sends: runs(dst, first, p).map(bytes).collect(),
            src: (x + p - big) % p,
            recvs,
            fill,
            work: big * c,
        }
    }
}

/// The step sizes b of the all-gather over `p` ranks (a power of two), in order:
/// 1, 2, …, p/2. The reduce-scatter runs them in reverse.
pub(super) fn sizes(p: usize) -> impl DoubleEndedIterator<Item = usize> {
    (0..p.trailing_zeros()).map(|i| 1usize << i)
}

/// The first chunk of the run of `b` chunks that holds chunk `r`.
pub(super) fn lo(r: usize, b: usize) -> usize {
    r & !(b - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_step_is_the_list_s_last() {
        for p in 2..70 {
            assert_eq!(Some(last_step(p)), steps(p).last().copied(), "p={p}");
        }
    }

    #[test]
    fn steps_move_every_chunk_once() {
        for p in 1..=70 {
            let s = steps(p);
            assert_eq!(s.iter().map(|&(_, m)| m).sum::<usize>(), p - 1, "p={p}");
            assert_eq!(s.len(), (p as f64).log2().ceil() as usize, "p={p}");
        }
        assert_eq!(steps(6), vec![(1, 1), (2, 2), (4, 2)]);
    }

    #[test]
    fn runs_split_at_the_wrap() {
        assert_eq!(runs(2, 3, 5).collect::<Vec<_>>(), vec![(2, 3)]);
        assert_eq!(runs(4, 3, 5).collect::<Vec<_>>(), vec![(4, 1), (0, 2)]);
        assert_eq!(runs(0, 5, 5).collect::<Vec<_>>(), vec![(0, 5)]);
    }
}
