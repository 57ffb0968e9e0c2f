//! `STRATA_NCCL`: what strata serves, read once at the first init.
//!
//! - `exact` (default; also unset, empty or `auto`): strata's exact algorithms, chosen
//!   per call by strata's model (`auto`; `STRATA_ALGO` still applies). Quantized
//!   algorithms are never chosen this way.
//! - `off`: every call to the real library. On strata's CPU device there is none, so
//!   init fails with `ncclInvalidUsage` and a message naming why.
//! - a comma list of strata algorithm names (`ring`, `hier`, `hier-ring`, `hier-log`,
//!   `log-step`, `ho-ring`, and the quantized `qgz`, `qgz-1hop`, `qwz` only when
//!   named): each all-gather, reduce-scatter and all-reduce runs the first name that
//!   fits it (`route.rs`): on a communicator strata joined (GPU, `join.rs`) `ring` or
//!   no fit is the real call; on strata's CPU device strata's ring. Other calls on the
//!   CPU device run strata's own choice (`auto`, `STRATA_ALGO`).
//!
//! A bad value is an init error (`ncclInvalidArgument`) naming the accepted values.

use std::str::FromStr;
use std::sync::OnceLock;
use strata::Algo;

/// What `STRATA_NCCL` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Serve {
    /// Every call to the real library.
    Off,
    /// strata's exact algorithms, `auto`.
    Exact,
    /// strata algorithms by name, in the given order (at least one).
    Algos(Vec<Algo>),
}

impl Serve {
    /// Parse a value of `STRATA_NCCL` (`None`: unset).
    pub fn parse(v: Option<&str>) -> Result<Serve, String> {
        let v = v.map(str::trim).unwrap_or("");
        match v.to_ascii_lowercase().as_str() {
            "" | "exact" | "auto" => return Ok(Serve::Exact),
            "off" => return Ok(Serve::Off),
            _ => {}
        }
        let mut algos = Vec::new();
        for name in v.split(',') {
            let name = name.trim();
            if name.is_empty() {
                return Err(format!("STRATA_NCCL={v:?} has an empty item (use off, exact, or a comma list of strata algorithm names)"));
            }
            let a = Algo::from_str(name)
                .map_err(|e| format!("STRATA_NCCL={v:?}: {e}; or use off or exact"))?;
            if a == Algo::Auto {
                return Err(format!(
                    "STRATA_NCCL={v:?}: auto is exact; it cannot be part of a list"
                ));
            }
            algos.push(a);
        }
        Ok(Serve::Algos(algos))
    }

    /// What is served, for the startup line: on strata's CPU device (every call), or
    /// (`gpu`) on the communicators strata joined, beside the real library.
    pub fn describe(&self, gpu: bool) -> String {
        let other = if gpu { "NCCL's" } else { "strata's ring" };
        match self {
            Serve::Off => "nothing (STRATA_NCCL=off)".into(),
            Serve::Exact if gpu => "all-gather, reduce-scatter and all-reduce by strata's exact algorithms where its model says they beat NCCL's".into(),
            Serve::Exact => "every call, strata's exact algorithms (auto)".into(),
            Serve::Algos(a) => {
                let names: Vec<&str> = a.iter().map(|a| a.name()).collect();
                format!(
                    "{}all-gather, reduce-scatter and all-reduce by strata's {}, the first that fits each call (none: {other})",
                    if gpu { "" } else { "every call; " },
                    names.join(",")
                )
            }
        }
    }
}

/// `STRATA_NCCL` of this process, parsed once.
pub fn serve() -> &'static Result<Serve, String> {
    static S: OnceLock<Result<Serve, String>> = OnceLock::new();
    S.get_or_init(|| Serve::parse(std::env::var("STRATA_NCCL").ok().as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_value_chooses() {
        assert_eq!(Serve::parse(None), Ok(Serve::Exact));
        assert_eq!(Serve::parse(Some("")), Ok(Serve::Exact));
        assert_eq!(Serve::parse(Some("exact")), Ok(Serve::Exact));
        assert_eq!(Serve::parse(Some(" AUTO ")), Ok(Serve::Exact));
        assert_eq!(Serve::parse(Some("off")), Ok(Serve::Off));
        assert_eq!(
            Serve::parse(Some("hier,log-step")),
            Ok(Serve::Algos(vec![Algo::Hier, Algo::LogStep]))
        );
        assert_eq!(Serve::parse(Some("qgz")), Ok(Serve::Algos(vec![Algo::Qgz])));
        let s = Serve::parse(Some("hier,log-step")).unwrap();
        assert!(s.describe(false).contains(
            "every call; all-gather, reduce-scatter and all-reduce by strata's hier,log-step, the first that fits each call (none: strata's ring)"
        ));
        assert!(s
            .describe(true)
            .contains("by strata's hier,log-step, the first that fits each call (none: NCCL's)"));
    }

    #[test]
    fn bad_values_say_why() {
        let e = Serve::parse(Some("fast")).unwrap_err();
        assert!(
            e.contains("unknown algorithm") && e.contains("off or exact"),
            "{e}"
        );
        assert!(Serve::parse(Some("hier,,ring"))
            .unwrap_err()
            .contains("empty item"));
        assert!(Serve::parse(Some("hier,auto"))
            .unwrap_err()
            .contains("auto is exact"));
    }
}
