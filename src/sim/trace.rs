//! Chrome-trace JSON (the Trace Event Format; loads in Perfetto and chrome://tracing)
//! of a replayed schedule.
//!
//! One process per rank (`pid` = world rank, named `rank R (node N)`), one thread
//! (track) per link class (`tid` = [`LinkClass::index`], named `intra_package`,
//! `intra_node`, `inter_node`), one complete event (`"ph": "X"`) per transfer on its
//! sender's track: `ts` / `dur` in microseconds, `name` `-> DST`, `cat` the class, and
//! `args` {dst, bytes, ring, step}. A rank's transfers of one class never overlap
//! (each class is one resource per rank in the replay), so the tracks nest cleanly; two
//! tracks of one rank busy at the same time are HO-Ring's overlap. Metadata events
//! (`"ph": "M"`) name and order processes and threads.

use super::replay::Replay;
use super::schedule::Schedule;
use crate::error::{Error, Result};
use crate::topology::{LinkClass, Topology};
use serde_json::json;
use std::io::Write;

/// Write the trace of `s` replayed as `r` on `topo` to `w` (streamed: one event per
/// line, so million-transfer schedules need no large string).
pub fn write_trace<W: Write>(w: &mut W, s: &Schedule, r: &Replay, topo: &Topology) -> Result<()> {
    let io = |e: std::io::Error| Error::System(format!("cannot write trace: {e}"));
    if r.times.len() != s.len() {
        return Err(Error::InvalidArgument(
            "replay does not belong to this schedule".into(),
        ));
    }
    let mut used = vec![[false; 3]; s.ranks];
    for t in &s.transfers {
        used[t.src as usize][t.class.index()] = true;
    }
    writeln!(
        w,
        "{{\"displayTimeUnit\":\"ns\",\"otherData\":{},\"traceEvents\":[",
        json!({
            "topology": topo.name,
            "algo": s.algo.map(|a| a.name()),
            "transfers": s.len(),
            "makespan_us": r.makespan_us,
            "lower_bound_us": r.lower_bound_us,
        })
    )
    .map_err(io)?;
    let mut first = true;
    let mut emit = |w: &mut W, v: serde_json::Value| -> Result<()> {
        if !first {
            w.write_all(b",\n").map_err(io)?;
        }
        first = false;
        serde_json::to_writer(&mut *w, &v).map_err(|e| Error::System(format!("trace: {e}")))
    };
    for (rank, u) in used.iter().enumerate() {
        if !u.iter().any(|&x| x) {
            continue;
        }
        let c = topo.coord(rank);
        emit(
            w,
            json!({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
            "args": {"name": format!("rank {rank} (node {} pkg {} die {})", c.node, c.package, c.die)}}),
        )?;
        emit(
            w,
            json!({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
            "args": {"sort_index": rank}}),
        )?;
        for class in LinkClass::ALL {
            if u[class.index()] {
                emit(
                    w,
                    json!({"name": "thread_name", "ph": "M", "pid": rank, "tid": class.index(),
                    "args": {"name": class.name()}}),
                )?;
                emit(
                    w,
                    json!({"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": class.index(),
                    "args": {"sort_index": class.index()}}),
                )?;
            }
        }
    }
    for (i, t) in s.transfers.iter().enumerate() {
        let (st, end) = r.times[i];
        emit(
            w,
            json!({
                "name": format!("-> {}", t.dst),
                "cat": t.class.name(),
                "ph": "X",
                "ts": st,
                "dur": end - st,
                "pid": t.src,
                "tid": t.class.index(),
                "args": {"dst": t.dst, "bytes": t.bytes, "ring": s.ring_name(i), "step": t.step},
            }),
        )?;
    }
    w.write_all(b"\n]}\n").map_err(io)?;
    Ok(())
}

/// The trace as a string (small schedules, tests).
pub fn trace_json(s: &Schedule, r: &Replay, topo: &Topology) -> Result<String> {
    let mut v = Vec::new();
    write_trace(&mut v, s, r, topo)?;
    String::from_utf8(v).map_err(|e| Error::Internal(format!("trace is not UTF-8: {e}")))
}

/// Write the trace to the file `path` (buffered).
pub fn save_trace(path: &std::path::Path, s: &Schedule, r: &Replay, topo: &Topology) -> Result<()> {
    let f = std::fs::File::create(path)
        .map_err(|e| Error::System(format!("cannot create {}: {e}", path.display())))?;
    let mut w = std::io::BufWriter::new(f);
    write_trace(&mut w, s, r, topo)?;
    w.flush()
        .map_err(|e| Error::System(format!("cannot write {}: {e}", path.display())))
}
