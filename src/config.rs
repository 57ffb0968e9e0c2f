//! Configuration read once from the environment, NCCL style.
//!
//! - `STRATA_DEBUG=WARN|INFO|TRACE`: logging (which algorithm, which groups, which sizes);
//!   a comma list may add `check`: every collective first verifies that all ranks call
//!   the same one ([`crate::runtime::mismatch`]), e.g. `STRATA_DEBUG=check` or
//!   `STRATA_DEBUG=INFO,check`; other names are ignored, as NCCL_DEBUG does;
//! - `STRATA_ALGO=ring|log-step|hier|hier-ring|hier-log|ho-ring|auto` (or a quantized
//!   name): force an algorithm (a per-call hint still wins);
//! - `STRATA_TOPOLOGY=SPEC|FILE`: the topology when the caller gives none;
//! - `STRATA_HORING_CHUNKS=N`: pieces per chunk for `ho-ring` (default by size);
//! - `STRATA_TIMEOUT=SECONDS`: how long to wait for a peer before reporting an error
//!   (default 120);
//! - `STRATA_NCCL_LIB` / `STRATA_RCCL_LIB`: library overrides (GPU transports);
//! - `STRATA_LINKS=preset|probe|reprobe`: where `auto` and the model get link figures
//!   ([`LinkSource`]; default `preset`), `STRATA_LINKS_CACHE=DIR` where probed figures
//!   are kept, `STRATA_PROBE_NOISE=F` a testing aid that scales every rank's probe
//!   timings by its own random factor in [1-F, 1+F] (`crate::comm::probe`).

#![forbid(unsafe_code)]

use crate::error::{Error, Result};
use crate::kinds::Algo;
use once_cell::sync::Lazy;
use std::time::Duration;

/// Default time to wait for a peer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Where a new world's link figures come from (`STRATA_LINKS`, the C config's `links`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LinkSource {
    /// The topology's own figures (a preset's, or a topology file's): nothing measured.
    #[default]
    Preset,
    /// Measured by the link probe when the world is created, or read from the probe's
    /// cache when this host set was probed before.
    Probe,
    /// Measured afresh (the cache is rewritten).
    Reprobe,
}

impl LinkSource {
    /// `preset`, `probe`, `reprobe` (any case, blanks ignored; empty: `None`).
    pub fn parse(v: &str) -> Result<Option<LinkSource>> {
        match v.trim().to_ascii_lowercase().as_str() {
            "" => Ok(None),
            "preset" => Ok(Some(LinkSource::Preset)),
            "probe" => Ok(Some(LinkSource::Probe)),
            "reprobe" => Ok(Some(LinkSource::Reprobe)),
            _ => Err(Error::InvalidArgument(format!(
                "links {v:?} is not a link source (preset, probe, reprobe)"
            ))),
        }
    }

    /// The name `parse` reads.
    pub fn name(self) -> &'static str {
        match self {
            LinkSource::Preset => "preset",
            LinkSource::Probe => "probe",
            LinkSource::Reprobe => "reprobe",
        }
    }

    /// True when a new world runs (or reads) the probe.
    pub fn probes(self) -> bool {
        self != LinkSource::Preset
    }
}

/// Values read from the environment once per process.
#[derive(Debug, Clone)]
pub struct Env {
    pub algo: Option<Algo>,
    pub timeout: Duration,
    pub debug: Option<String>,
    /// `check` is among the names of `STRATA_DEBUG`: collective mismatch detection on
    /// every communicator ([`crate::runtime::mismatch`]).
    pub check: bool,
    pub ho_ring_chunks: Option<usize>,
    /// `STRATA_LINKS` (default [`LinkSource::Preset`]).
    pub links: LinkSource,
    /// `STRATA_LINKS_CACHE`: the directory of the probe's cache.
    pub links_cache: Option<std::path::PathBuf>,
    /// `STRATA_PROBE_NOISE` (0 when unset).
    pub probe_noise: f64,
}

fn read() -> Result<Env> {
    let algo = match std::env::var("STRATA_ALGO") {
        Ok(s) if !s.trim().is_empty() => Some(s.parse()?),
        _ => None,
    };
    let timeout = match std::env::var("STRATA_TIMEOUT") {
        Ok(s) if !s.trim().is_empty() => {
            let secs: f64 = s.trim().parse().map_err(|_| {
                Error::InvalidArgument(format!("STRATA_TIMEOUT='{s}' is not a number of seconds"))
            })?;
            if !(secs > 0.0 && secs.is_finite()) {
                return Err(Error::InvalidArgument(format!(
                    "STRATA_TIMEOUT='{s}' must be positive"
                )));
            }
            Duration::from_secs_f64(secs)
        }
        _ => DEFAULT_TIMEOUT,
    };
    let ho_ring_chunks = match std::env::var("STRATA_HORING_CHUNKS") {
        Ok(s) if !s.trim().is_empty() => match s.trim().parse::<usize>() {
            Ok(n) if n >= 1 => Some(n),
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "STRATA_HORING_CHUNKS='{s}' must be a positive integer"
                )))
            }
        },
        _ => None,
    };
    let debug = std::env::var("STRATA_DEBUG").ok();
    let links = LinkSource::parse(&std::env::var("STRATA_LINKS").unwrap_or_default())
        .map_err(|e| Error::InvalidArgument(format!("STRATA_LINKS: {e}")))?
        .unwrap_or_default();
    let links_cache = std::env::var_os("STRATA_LINKS_CACHE")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from);
    let probe_noise = match std::env::var("STRATA_PROBE_NOISE") {
        Ok(s) if !s.trim().is_empty() => match s.trim().parse::<f64>() {
            Ok(f) if (0.0..1.0).contains(&f) => f,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "STRATA_PROBE_NOISE='{s}' must be a fraction in [0, 1)"
                )))
            }
        },
        _ => 0.0,
    };
    Ok(Env {
        links,
        links_cache,
        probe_noise,
        ho_ring_chunks,
        algo,
        timeout,
        check: debug.as_deref().is_some_and(debug_check),
        debug,
    })
}

/// True when the comma list `STRATA_DEBUG=value` names `check` (any case, any spaces).
pub fn debug_check(value: &str) -> bool {
    value
        .split(',')
        .any(|t| t.trim().eq_ignore_ascii_case("check"))
}

static ENV: Lazy<Result<Env>> = Lazy::new(read);

/// The process environment, or the error a malformed variable caused.
pub fn env() -> Result<Env> {
    ENV.clone()
}

/// Where strata keeps what it measured or compiled once per machine (the link probe's
/// figures, compiled GPU kernels): `$XDG_CACHE_HOME/strata`, else
/// `$HOME/.cache/strata`, else `<temp>/strata-cache`.
pub fn cache_dir() -> std::path::PathBuf {
    use std::path::PathBuf;
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("XDG_CACHE_HOME")
        .map(|d| d.join("strata"))
        .or_else(|| var("HOME").map(|h| h.join(".cache").join("strata")))
        .unwrap_or_else(|| std::env::temp_dir().join("strata-cache"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_is_a_comma_list_that_may_name_check() {
        assert!(debug_check("check"));
        assert!(debug_check("INFO,check"));
        assert!(debug_check(" WARN , CHECK "));
        assert!(!debug_check("INFO"));
        assert!(!debug_check(""));
        assert!(!debug_check("checks"));
    }

    #[test]
    fn link_sources_parse() {
        assert_eq!(
            LinkSource::parse(" Probe ").unwrap(),
            Some(LinkSource::Probe)
        );
        assert_eq!(
            LinkSource::parse("reprobe").unwrap(),
            Some(LinkSource::Reprobe)
        );
        assert_eq!(
            LinkSource::parse("preset").unwrap(),
            Some(LinkSource::Preset)
        );
        assert_eq!(LinkSource::parse("").unwrap(), None);
        let e = LinkSource::parse("measured").unwrap_err().to_string();
        assert!(e.contains("preset, probe, reprobe"), "{e}");
        assert!(LinkSource::Probe.probes() && !LinkSource::Preset.probes());
    }
}
