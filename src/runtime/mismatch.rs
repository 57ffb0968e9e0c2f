//! Collective mismatch detection (`STRATA_DEBUG=check`, or [`crate::comm::Comm::set_check`]),
//! PyTorch's desync debugging for strata: before a collective runs, every rank of the
//! communicator verifies that all ranks called the same one, and on a mismatch every
//! rank fails with the same [`Error::InvalidUsage`] naming the ranks that differ and
//! what each called, instead of a timeout or silently wrong data.
//!
//! - What is compared: a description of the call ([`describe`]): op, count (the list of
//!   counts of a coalesced op), dtype, reduction, root, the algorithm the rank chose and
//!   the quantization format when one was given. A group (group start/end) is compared
//!   as the sequence of its collectives on the communicator, in submission order. The
//!   in-place flag is not compared: NCCL lets each rank choose it.
//! - How: on the communicator's stream, so in stream order and never confused by queued
//!   work, each rank all-gathers a 24-byte fingerprint (a per-communicator sequence
//!   number, the description's length and its FNV-1a hash) over the communicator's own
//!   transport. When all agree the collective runs; otherwise the ranks all-gather
//!   their descriptions (every rank knows the longest from the fingerprints) and build
//!   the same message, e.g. `collective mismatch on a communicator of 4 ranks (seq 17):
//!   ranks 0,1,3 called all-gather(count=1024, f32, ring); rank 2 called
//!   all-gather(count=512, f32, ring)` (ranks are world ranks; "world ranks" when the
//!   communicator is not the world). The collective then runs on no rank, so the
//!   communicator stays usable.
//! - Not checked: point-to-point ops (send, recv, the internal send-recv step). They
//!   involve two ranks, not the communicator, and their pairing is asymmetric by nature
//!   (one rank sends what the other receives); a count that differs between the pair is
//!   already an error of the transport's receive (a message of another length). A group
//!   made only of them is not checked; in a mixed group only its collectives are.
//!   Splits, barriers and traffic sums are not checked either.
//! - Cost: one small all-gather per collective (or per group) on the communicator;
//!   nothing when off (a flag captured at submit). Every rank must have the same
//!   setting. The fingerprint's bytes are counted in the local transport's traffic.

#![forbid(unsafe_code)]

use super::request::{Op, Request};
use super::CommCore;
use crate::error::{Error, Result};
use crate::kinds::Algo;
use std::fmt::Write as _;

/// Bytes of one rank's fingerprint: seq (u64), description length (u64), hash (u64).
const FP: usize = 24;

/// The description compared across ranks of a collective `req` that will run with
/// `algo`, e.g. `all-reduce(count=1024, f32, sum, ring)`; `None` for point-to-point ops,
/// which are not checked (see the module doc).
pub fn describe(req: &Request, algo: Algo) -> Option<String> {
    let mut s = String::from(req.op.name());
    match &req.op {
        Op::Send { .. } | Op::Recv { .. } | Op::SendRecv { .. } => return None,
        Op::AllGather { count, .. }
        | Op::ReduceScatter { count, .. }
        | Op::AllReduce { count, .. }
        | Op::AllToAll { count, .. }
        | Op::Broadcast { count, .. } => {
            let _ = write!(s, "(count={count}");
        }
        Op::AllGatherCoalesced { counts, .. } | Op::ReduceScatterCoalesced { counts, .. } => {
            let _ = write!(s, "(counts={counts:?}");
        }
    }
    let _ = write!(s, ", {}", req.dtype);
    if let Some(op) = req.op.redop() {
        let _ = write!(s, ", {op}");
    }
    if let Op::Broadcast { root, .. } = &req.op {
        let _ = write!(s, ", root={root}");
    }
    let _ = write!(s, ", {algo}");
    if let Some(q) = &req.quant {
        let _ = write!(s, ", int{}/{}", q.bits, q.block);
    }
    s.push(')');
    Some(s)
}

/// [`verify`] as a collective's first step on the stream: `Err` when the collective must
/// not run. A mismatch is every rank's error and leaves the communicator usable; a failed
/// exchange (a dead peer) aborts it as a failed collective does.
pub(crate) fn check(core: &CommCore, calls: &[String]) -> Result<()> {
    match verify(core, calls) {
        Ok(r) => core.note(r),
        Err(e) => {
            let e = e.in_collective(|| format!("mismatch check of {}", calls.join(", ")));
            core.fail(&e);
            core.note(Err(e))
        }
    }
}

/// Verify on `core`'s stream thread that every rank calls `calls` (the descriptions of
/// one collective, or of a group's collectives in order; empty: nothing to check, no
/// exchange). `Err`: the exchange itself failed (a dead peer: handled like a failed
/// collective); `Ok(Err)`: the ranks differ, with the message every rank gets.
pub(crate) fn verify(core: &CommCore, calls: &[String]) -> Result<Result<()>> {
    if calls.is_empty() {
        return Ok(Ok(()));
    }
    let desc = match calls {
        [one] => one.clone(),
        _ => format!("group[{}]", calls.join(", ")),
    };
    let seq = core.next_check_seq();
    let (n, me) = (core.size(), core.rank());
    let t = core.transport();
    let mut fps = vec![0u8; n * FP];
    let mine = &mut fps[me * FP..(me + 1) * FP];
    mine[..8].copy_from_slice(&seq.to_le_bytes());
    mine[8..16].copy_from_slice(&(desc.len() as u64).to_le_bytes());
    mine[16..].copy_from_slice(&fnv1a(desc.as_bytes()).to_le_bytes());
    t.all_gather(&mut fps, FP)?;
    let fp = |r: usize| &fps[r * FP..(r + 1) * FP];
    if (0..n).all(|r| fp(r) == fp(me)) {
        return Ok(Ok(()));
    }
    let u64_at = |r: usize, at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&fp(r)[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let max = (0..n).map(|r| u64_at(r, 8)).max().unwrap_or(0);
    let width = usize::try_from(max)
        .ok()
        .filter(|&w| w <= 1 << 20)
        .ok_or_else(|| Error::Internal(format!("mismatch check: a description of {max} bytes")))?;
    let mut descs = vec![0u8; n * width];
    descs[me * width..me * width + desc.len()].copy_from_slice(desc.as_bytes());
    t.all_gather(&mut descs, width)?;
    let called: Vec<(String, u64)> = (0..n)
        .map(|r| {
            let len = (u64_at(r, 8) as usize).min(width);
            let d = &descs[r * width..r * width + len];
            (String::from_utf8_lossy(d).into_owned(), u64_at(r, 0))
        })
        .collect();
    Ok(Err(Error::InvalidUsage(message(core.members(), &called))))
}

/// The mismatch message for `called[r]` = (description, seq) of communicator rank `r`
/// whose world rank is `members[r]`: the distinct calls in order of their first rank.
pub fn message(members: &[usize], called: &[(String, u64)]) -> String {
    let world = members.iter().enumerate().all(|(i, &m)| i == m);
    let same_seq = called.iter().all(|c| c.1 == called[0].1);
    let mut distinct: Vec<(&(String, u64), Vec<usize>)> = Vec::new();
    for (r, c) in called.iter().enumerate() {
        match distinct.iter_mut().find(|(d, _)| *d == c) {
            Some((_, rs)) => rs.push(members[r]),
            None => distinct.push((c, vec![members[r]])),
        }
    }
    let mut m = format!(
        "collective mismatch on a communicator of {} ranks",
        called.len()
    );
    if same_seq {
        let _ = write!(m, " (seq {})", called.first().map_or(0, |c| c.1));
    }
    m.push(':');
    for (i, ((desc, seq), ranks)) in distinct.iter().enumerate() {
        let who = match (world, ranks.len()) {
            (true, 1) => "rank",
            (true, _) => "ranks",
            (false, 1) => "world rank",
            (false, _) => "world ranks",
        };
        let sep = if i == 0 { " " } else { "; " };
        let _ = write!(m, "{sep}{who} {} called {desc}", list(ranks));
        if !same_seq {
            let _ = write!(m, " as call {seq}");
        }
    }
    m
}

/// `0-2,5,7-8`: ascending ranks, runs of three or more as ranges.
fn list(ranks: &[usize]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        match j - i {
            0 => out.push(ranks[i].to_string()),
            1 => out.extend([ranks[i].to_string(), ranks[j].to_string()]),
            _ => out.push(format!("{}-{}", ranks[i], ranks[j])),
        }
        i = j + 1;
    }
    out.join(",")
}

/// FNV-1a, 64 bits: the same in every process of every build.
fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_groups_ranks_by_call() {
        let c = |d: &str| (d.to_string(), 17);
        let called = [c("a(1)"), c("a(1)"), c("b(2)"), c("a(1)")];
        assert_eq!(
            message(&[0, 1, 2, 3], &called),
            "collective mismatch on a communicator of 4 ranks (seq 17): ranks 0,1,3 called a(1); rank 2 called b(2)"
        );
        assert_eq!(
            message(&[4, 5, 6, 7], &called),
            "collective mismatch on a communicator of 4 ranks (seq 17): world ranks 4,5,7 called a(1); world rank 6 called b(2)"
        );
        let mut called = vec![c("a"); 6];
        called[5] = ("a".into(), 3);
        assert_eq!(
            message(&[0, 1, 2, 3, 4, 5], &called),
            "collective mismatch on a communicator of 6 ranks: ranks 0-4 called a as call 17; rank 5 called a as call 3"
        );
    }

    #[test]
    fn rank_lists_compress_runs() {
        assert_eq!(list(&[0, 1, 2, 5, 7, 8]), "0-2,5,7,8");
        assert_eq!(list(&[3]), "3");
        assert_eq!(list(&[]), "");
    }

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
