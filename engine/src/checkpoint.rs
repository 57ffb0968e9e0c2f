//! Sharded checkpoints (issue 51): every `K` steps each rank writes its own shard of the
//! training state (the fp32 master weights and AdamW moments of its OS shard, per unit,
//! and the step count) and nothing is gathered; a complete checkpoint restores on any
//! world size and strategy ([`crate::Engine::restored`] cuts the shards for the new
//! world), which is how training goes on after ranks are lost when the strategy kept
//! no replica of their shards (ZeRO-3's optimizer states are on one rank each).
//!
//! Layout: `DIR/step-<step>/rank-<rank>.shard` (written to a temporary name, then
//! renamed), and `DIR/step-<step>/COMPLETE` (the world size), written by rank 0 once
//! every rank wrote its shard; a step without it (a rank died while writing) is ignored.
//! A shard file: `STRATACK`, version 1, step, unit count, then per unit its true length,
//! the offset of the shard in the unit's padded vector and the shard's length, then the
//! master weights, the first and the second moments (little-endian `u64`s and `f32`s).
//! Replicas (ranks holding the same OS shard) write the same values; reading takes any.

use crate::error::{Error, Result};
use std::fs;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"STRATACK";
const VERSION: u64 = 1;
const COMPLETE: &str = "COMPLETE";

/// One unit's part of a rank's shard.
#[derive(Debug, Clone, PartialEq)]
pub struct UnitShard {
    /// The unit's true parameter count (its padded vector is longer).
    pub len: usize,
    /// Where the shard starts in the unit's padded vector.
    pub offset: usize,
    pub master: Vec<f32>,
    pub m: Vec<f32>,
    pub v: Vec<f32>,
}

/// What one rank writes.
#[derive(Debug, Clone, PartialEq)]
pub struct Shard {
    /// Optimizer steps taken.
    pub step: u64,
    pub units: Vec<UnitShard>,
}

/// One unit's whole state (true length each).
#[derive(Debug, Clone, PartialEq)]
pub struct UnitState {
    pub master: Vec<f32>,
    pub m: Vec<f32>,
    pub v: Vec<f32>,
}

/// The whole training state, assembled from a complete checkpoint's shards.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    pub step: u64,
    pub units: Vec<UnitState>,
}

fn io(what: &str, p: &Path, e: std::io::Error) -> Error {
    Error::Config(format!("checkpoint: {what} {}: {e}", p.display()))
}

/// The directory of step `step`'s checkpoint under `dir`.
pub fn step_dir(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("step-{step:012}"))
}

/// `shard` as bytes (the shard file's format; also how survivors exchange their
/// in-memory shards, [`crate::train`]).
pub fn encode(shard: &Shard) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(MAGIC);
    for x in [VERSION, shard.step, shard.units.len() as u64] {
        b.extend_from_slice(&x.to_le_bytes());
    }
    for u in &shard.units {
        for x in [u.len, u.offset, u.master.len()] {
            b.extend_from_slice(&(x as u64).to_le_bytes());
        }
        for v in [&u.master, &u.m, &u.v] {
            v.iter().for_each(|x| b.extend_from_slice(&x.to_le_bytes()));
        }
    }
    b
}

/// Write `shard` as rank `rank`'s part of step `shard.step`'s checkpoint.
pub fn write_shard(dir: &Path, rank: usize, shard: &Shard) -> Result<()> {
    let d = step_dir(dir, shard.step);
    fs::create_dir_all(&d).map_err(|e| io("creating", &d, e))?;
    let f = d.join(format!("rank-{rank:06}.shard"));
    let tmp = d.join(format!(".rank-{rank:06}.shard.tmp"));
    fs::write(&tmp, encode(shard)).map_err(|e| io("writing", &tmp, e))?;
    fs::rename(&tmp, &f).map_err(|e| io("renaming", &f, e))
}

/// Mark step `step`'s checkpoint complete (rank 0, once every rank wrote its shard).
pub fn mark_complete(dir: &Path, step: u64, world: usize) -> Result<()> {
    let f = step_dir(dir, step).join(COMPLETE);
    fs::write(&f, format!("{world}\n")).map_err(|e| io("writing", &f, e))
}

/// The latest complete checkpoint's step under `dir` (`None`: none).
pub fn latest(dir: &Path) -> Result<Option<u64>> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Ok(None);
    };
    let mut best = None;
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(step) = name
            .to_str()
            .and_then(|n| n.strip_prefix("step-"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        if e.path().join(COMPLETE).is_file() && best.is_none_or(|b| step > b) {
            best = Some(step);
        }
    }
    Ok(best)
}

/// Little-endian reader over a shard file.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
    what: &'a str,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let s = self
            .b
            .get(self.at..self.at + n)
            .ok_or_else(|| Error::Config(format!("checkpoint: {} is truncated", self.what)))?;
        self.at += n;
        Ok(s)
    }
    fn u64(&mut self) -> Result<u64> {
        let s = self.take(8)?;
        Ok(u64::from_le_bytes(s.try_into().expect("8 bytes")))
    }
    fn f32s(&mut self, n: usize) -> Result<Vec<f32>> {
        let s = self.take(n * 4)?;
        Ok(s.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect())
    }
}

/// The shard encoded in `b` ([`encode`]); `what` names it in errors.
pub fn decode(b: &[u8], what: &str) -> Result<Shard> {
    let mut r = Reader { b, at: 0, what };
    if r.take(8)? != MAGIC || r.u64()? != VERSION {
        return Err(Error::Config(format!(
            "checkpoint: {what} is not a strata shard of version {VERSION}"
        )));
    }
    let step = r.u64()?;
    let n = r.u64()? as usize;
    let mut units = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        let (len, offset, olen) = (r.u64()? as usize, r.u64()? as usize, r.u64()? as usize);
        let (master, m, v) = (r.f32s(olen)?, r.f32s(olen)?, r.f32s(olen)?);
        units.push(UnitShard {
            len,
            offset,
            master,
            m,
            v,
        });
    }
    Ok(Shard { step, units })
}

/// Read one shard file.
pub fn read_shard(path: &Path) -> Result<Shard> {
    let b = fs::read(path).map_err(|e| io("reading", path, e))?;
    decode(&b, &path.display().to_string())
}

/// The whole state of step `step` from `shards` (each named for errors): replicas
/// agree, any covers its range; an element of a unit that no shard covers is an error
/// naming the unit.
pub fn assemble(shards: &[(String, Shard)], step: u64, what: &str) -> Result<State> {
    if shards.is_empty() {
        return Err(Error::Config(format!("checkpoint: {what} has no shards")));
    }
    let mut units: Vec<(UnitState, Vec<bool>)> = Vec::new();
    for (name, s) in shards {
        if s.step != step {
            return Err(Error::Config(format!(
                "checkpoint: {name} holds step {}, not {step}",
                s.step
            )));
        }
        if units.is_empty() {
            units = s
                .units
                .iter()
                .map(|u| {
                    let z = vec![0f32; u.len];
                    let st = UnitState {
                        master: z.clone(),
                        m: z.clone(),
                        v: z,
                    };
                    (st, vec![false; u.len])
                })
                .collect();
        }
        if s.units.len() != units.len() {
            return Err(Error::Config(format!(
                "checkpoint: {name} has {} units, other shards {}",
                s.units.len(),
                units.len()
            )));
        }
        for (u, (st, seen)) in s.units.iter().zip(units.iter_mut()) {
            if u.len != st.master.len() {
                return Err(Error::Config(format!(
                    "checkpoint: {name} disagrees on a unit's length"
                )));
            }
            // Padding past the true length is dropped.
            let end = (u.offset + u.master.len()).min(u.len);
            for i in u.offset.min(end)..end {
                let k = i - u.offset;
                st.master[i] = u.master[k];
                st.m[i] = u.m[k];
                st.v[i] = u.v[k];
                seen[i] = true;
            }
        }
    }
    let mut out = Vec::with_capacity(units.len());
    for (i, (st, seen)) in units.into_iter().enumerate() {
        if let Some(j) = seen.iter().position(|s| !s) {
            return Err(Error::Config(format!(
                "checkpoint: {what}: no shard holds element {j} of unit {i} (a lost rank's \
                 shard, and no replica)"
            )));
        }
        out.push(st);
    }
    Ok(State { step, units: out })
}

/// The whole state of step `step`'s complete checkpoint under `dir`, from every rank's
/// shard (replicas agree; any covers its range). An element of a unit that no shard
/// covers is an error naming the unit.
pub fn read_state(dir: &Path, step: u64) -> Result<State> {
    let d = step_dir(dir, step);
    if !d.join(COMPLETE).is_file() {
        return Err(Error::Config(format!(
            "checkpoint: {} is not complete",
            d.display()
        )));
    }
    let mut files: Vec<PathBuf> = fs::read_dir(&d)
        .map_err(|e| io("listing", &d, e))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "shard"))
        .collect();
    files.sort();
    let shards = files
        .iter()
        .map(|f| Ok((f.display().to_string(), read_shard(f)?)))
        .collect::<Result<Vec<_>>>()?;
    assemble(&shards, step, &d.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_assemble_into_the_state_and_gaps_are_named() {
        let dir = std::env::temp_dir().join(format!("strata-ckpt-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let unit = |offset: usize, vals: &[f32]| UnitShard {
            len: 5,
            offset,
            master: vals.to_vec(),
            m: vals.iter().map(|x| x * 10.0).collect(),
            v: vals.iter().map(|x| x * 100.0).collect(),
        };
        // A unit of 5 padded to 6, in shards of 3 (the second holds the padding).
        for (r, u) in [(0, unit(0, &[1., 2., 3.])), (1, unit(3, &[4., 5., 0.]))] {
            write_shard(
                &dir,
                r,
                &Shard {
                    step: 7,
                    units: vec![u],
                },
            )
            .unwrap();
        }
        assert_eq!(latest(&dir).unwrap(), None, "not complete yet");
        mark_complete(&dir, 7, 2).unwrap();
        assert_eq!(latest(&dir).unwrap(), Some(7));
        let s = read_state(&dir, 7).unwrap();
        assert_eq!(s.step, 7);
        assert_eq!(s.units[0].master, [1., 2., 3., 4., 5.]);
        assert_eq!(s.units[0].v, [100., 200., 300., 400., 500.]);
        // Rank 1's shard lost, no replica: the gap is named.
        fs::remove_file(step_dir(&dir, 7).join("rank-000001.shard")).unwrap();
        let e = read_state(&dir, 7).unwrap_err().to_string();
        assert!(e.contains("element 3 of unit 0"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
