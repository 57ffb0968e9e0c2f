//! The SPEC grammar (the folder's doc, [`super`]) and the constructors that take their
//! links from [`super::presets`]: above both the topology's types ([`super::layout`])
//! and the presets.

#![forbid(unsafe_code)]

use std::path::Path;

use super::presets;
use super::{Links, Topology, ACCEPTED_FORMS, ENV_TOPOLOGY};
use crate::error::{Error, Result};
use crate::invalid_arg;

impl Topology {
    /// Parses a SPEC (grammar in the module doc) or loads a JSON file: `spec` is taken as
    /// a path when it ends with `.json` or names an existing file.
    ///
    /// Errors: `InvalidArgument` for zero sizes, missing numbers, unknown presets,
    /// garbage (the message lists [`ACCEPTED_FORMS`]), and for unreadable or invalid files.
    pub fn parse(spec: &str) -> Result<Topology> {
        let raw = spec.trim();
        if raw.is_empty() {
            return invalid_arg!("empty topology spec; {ACCEPTED_FORMS}");
        }
        let path = Path::new(raw);
        if raw.to_ascii_lowercase().ends_with(".json") || path.is_file() {
            return Topology::load(path);
        }
        let lower: String = raw
            .to_ascii_lowercase()
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        let bad = |why: &str| -> Error {
            Error::InvalidArgument(format!(
                "bad topology spec {raw:?}: {why}; {ACCEPTED_FORMS}"
            ))
        };
        let (body, switch) = match lower.split_once(',') {
            None => (lower.as_str(), None),
            Some((body, rest)) => {
                let k = rest
                    .strip_prefix("switch=")
                    .ok_or_else(|| bad("the only suffix is ,switch=K"))?;
                (
                    body,
                    Some(parse_size(k, "K (nodes per switch)").map_err(|w| bad(&w))?),
                )
            }
        };
        let (kind, args) = body.split_once(':').ok_or_else(|| bad("missing ':'"))?;
        let mut t = if kind == "nodes" {
            let dims = args
                .split('x')
                .map(|s| parse_size(s, "size"))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|w| bad(&w))?;
            match dims[..] {
                [n, r] => Topology::uniform(n, r),
                [n, p, d] => {
                    Topology::with_links(body, n, p, d, presets::generic_links(p.saturating_mul(d)))
                }
                _ => return Err(bad("nodes: takes NxR or NxPxD")),
            }
        } else {
            let p = presets::find(kind).ok_or_else(|| bad(&format!("unknown preset {kind:?}")))?;
            let n = parse_size(args, "N (nodes)").map_err(|w| bad(&w))?;
            p.topology(n)
        };
        t.name = body.to_string();
        if t.nodes
            .checked_mul(t.packages_per_node)
            .and_then(|x| x.checked_mul(t.dies_per_package))
            .is_none()
        {
            return Err(bad("world size overflows"));
        }
        if let Some(k) = switch {
            t = t.with_nodes_per_switch(k)?;
            t.name = lower.clone();
        }
        t.validate()?;
        Ok(t)
    }

    fn with_links(
        name: &str,
        nodes: usize,
        packages: usize,
        dies: usize,
        links: Links,
    ) -> Topology {
        Topology {
            name: name.to_string(),
            nodes,
            packages_per_node: packages,
            dies_per_package: dies,
            switch_of_node: None,
            links,
            measured: None,
        }
    }

    /// `nodes:NxR`: `nodes` nodes of `ranks_per_node` packages of 1 die each (so all
    /// intra-node links are `intra_node`), generic links ([`presets::generic_links`]).
    /// Not validated: zero sizes give an empty world (see [`Topology::validate`]).
    pub fn uniform(nodes: usize, ranks_per_node: usize) -> Topology {
        Topology::with_links(
            &format!("nodes:{nodes}x{ranks_per_node}"),
            nodes,
            ranks_per_node,
            1,
            presets::generic_links(ranks_per_node),
        )
    }

    /// One node of `world` ranks: the topology used when none is given.
    pub fn flat(world: usize) -> Topology {
        Topology::uniform(1, world)
    }

    /// `STRATA_TOPOLOGY` parsed with [`Topology::parse`]; `Ok(None)` when unset or blank.
    pub fn from_env() -> Result<Option<Topology>> {
        Topology::from_env_value(std::env::var(ENV_TOPOLOGY))
    }

    pub(super) fn from_env_value(
        v: std::result::Result<String, std::env::VarError>,
    ) -> Result<Option<Topology>> {
        match v {
            Ok(v) if !v.trim().is_empty() => Topology::parse(&v).map(Some).map_err(|e| match e {
                Error::InvalidArgument(m) => Error::InvalidArgument(format!("{ENV_TOPOLOGY}: {m}")),
                e => e,
            }),
            Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                invalid_arg!("{ENV_TOPOLOGY} is not valid UTF-8")
            }
        }
    }
}

/// A size >= 1, or the reason it is not (for the caller's message).
fn parse_size(s: &str, what: &str) -> std::result::Result<usize, String> {
    if s.is_empty() {
        return Err(format!("missing {what}"));
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{what} {s:?} is not a number"));
    }
    match s.parse::<usize>() {
        Ok(0) => Err(format!("{what} must be >= 1")),
        Ok(v) => Ok(v),
        Err(_) => Err(format!("{what} {s:?} is too large")),
    }
}
