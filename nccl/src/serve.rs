//! `STRATA_NCCL`: what strata serves, read once at the first init.
//!
//! - `exact` (default; also unset, empty or `auto`): strata's exact algorithms, chosen
//!   per call by strata's model (`auto`; `STRATA_ALGO` still applies). Quantized
//!   algorithms are never chosen this way.
//! - `off`: every call to the real library. On strata's CPU device there is none, so
//!   init fails with `ncclInvalidUsage` and a message naming why.
//! - a comma list of strata algorithm names (`ring`, `hier`, `hier-ring`, `hier-log`,
//!   `log-step`, `ho-ring`, and the quantized `qgz`, `qgz-1hop`, `qwz` only when
//!   named). On a communicator strata joined (GPU, `join.rs`) each call runs the first
//!   name that fits it (`route.rs`; `ring`: the real call; none: the real call). On
//!   strata's CPU device a communicator holds ONE default algorithm, so the first name
//!   becomes it; the others are checked and reported on the startup line as not applied.
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

    /// The strata config's `algo` string: `None` for exact (strata's default:
    /// `STRATA_ALGO`, else `auto`), else the first named algorithm.
    pub fn config_algo(&self) -> Option<&'static std::ffi::CStr> {
        match self {
            Serve::Algos(a) => Some(match a[0] {
                Algo::Ring => c"ring",
                Algo::Hier => c"hier",
                Algo::HierRing => c"hier-ring",
                Algo::HierLog => c"hier-log",
                Algo::LogStep => c"log-step",
                Algo::HoRing => c"ho-ring",
                Algo::Qgz => c"qgz",
                Algo::Qgz1 => c"qgz-1hop",
                Algo::Qwz => c"qwz",
                Algo::Auto => c"auto",
            }),
            _ => None,
        }
    }

    /// What is served, for the startup line: on strata's CPU device, or (`per_call`) on
    /// communicators strata joined, where the route decides per call.
    pub fn describe(&self, per_call: bool) -> String {
        match self {
            Serve::Off => "nothing (STRATA_NCCL=off)".into(),
            Serve::Exact if per_call => "all-gather, reduce-scatter and all-reduce by strata's exact algorithms where its model says they beat NCCL's".into(),
            Serve::Exact => "every call, strata's exact algorithms (auto)".into(),
            Serve::Algos(a) if per_call => {
                let names: Vec<&str> = a.iter().map(|a| a.name()).collect();
                format!("all-gather, reduce-scatter and all-reduce by strata's {}, the first that fits each call", names.join(","))
            }
            Serve::Algos(a) => {
                let mut s = format!("every call, strata algorithm {}", a[0].name());
                if a.len() > 1 {
                    let rest: Vec<&str> = a[1..].iter().map(|a| a.name()).collect();
                    s += &format!(
                        " ({} named but not applied: a strata communicator has one default algorithm)",
                        rest.join(",")
                    );
                }
                s
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
        assert_eq!(s.config_algo(), Some(c"hier"));
        assert!(s.describe(false).contains("log-step named but not applied"));
        assert!(s
            .describe(true)
            .contains("strata's hier,log-step, the first that fits each call"));
        assert_eq!(Serve::Exact.config_algo(), None);
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
