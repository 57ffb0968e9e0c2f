//! Command-line value parsers shared by `strata-perf` and `strata-sim` (clap
//! `value_parser`s: `Err` carries the message clap prints).

use strata::check::Kind;
use strata::{Algo, DataType, Error};

/// The message of a strata error without its category prefix (clap adds its own).
pub fn bare(e: Error) -> String {
    match e {
        Error::InvalidArgument(m) | Error::InvalidUsage(m) => m,
        e => e.to_string(),
    }
}

/// `e` as tool `tool` prints it, with the next step in the tool's own terms
/// (docs/errors.md): a transport this build lacks names the cargo command that builds the
/// tool with its feature (and, for mpi, the mpirun line) instead of the library's hint.
pub fn describe(tool: &str, e: &Error) -> String {
    let msg = e.to_string();
    let Some(f) = e.missing_feature() else {
        return msg;
    };
    let msg = msg.replace(&format!(" (cargo build --features {f})"), "");
    if f == "mpi" {
        format!(
            "{msg}\n  next: cargo build --release -p strata-tools --features mpi, then \
             mpirun -np <ranks> target/release/{tool} --transport mpi <arguments>"
        )
    } else {
        format!(
            "{msg}\n  next: cargo run --release -p strata-tools --features {f} --bin {tool} -- \
             <the same arguments>"
        )
    }
}

/// An op name (`all-gather`, `reduce-scatter`, ...).
pub fn parse_kind(s: &str) -> Result<Kind, String> {
    s.trim().to_ascii_lowercase().parse().map_err(bare)
}

/// An algorithm name (`ring`, `hier`, `ho-ring`, `qgz`, ...).
pub fn parse_algo(s: &str) -> Result<Algo, String> {
    s.parse().map_err(bare)
}

/// A dtype name (`f32`, `f16`, `bf16`, ...).
pub fn parse_dtype(s: &str) -> Result<DataType, String> {
    s.trim().parse().map_err(bare)
}

/// A size in bytes as nccl-tests writes it: a number, optionally followed by K, M, G or
/// T (powers of 1024, with or without `i`/`B`); zero allowed (strata's one size parser,
/// [`strata::units::parse_size_or_zero`]).
pub fn parse_size(s: &str) -> Result<u64, String> {
    strata::units::parse_size_or_zero(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/errors.md: a tool's "not compiled" names the tool's own build command.
    #[test]
    fn describe_names_the_tools_build() {
        use strata::transport::TransportKind;
        let m = describe(
            "strata-perf",
            &strata::comm::bootstrap::not_compiled(TransportKind::Mpi),
        );
        assert!(
            m.starts_with("not compiled: the mpi transport needs the `mpi` feature\n"),
            "{m}"
        );
        assert!(
            m.contains("cargo build --release -p strata-tools --features mpi"),
            "{m}"
        );
        assert!(
            m.contains("mpirun -np <ranks> target/release/strata-perf --transport mpi"),
            "{m}"
        );
        let m = describe(
            "strata-launch",
            &strata::comm::bootstrap::not_compiled(TransportKind::Nccl),
        );
        assert!(
            m.contains(
                "cargo run --release -p strata-tools --features cuda --bin strata-launch --"
            ),
            "{m}"
        );
        assert!(!m.contains("(cargo build --features cuda)"), "{m}");
        let e = Error::InvalidUsage("x".into());
        assert_eq!(describe("strata-perf", &e), e.to_string());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1K"), Ok(1024));
        assert_eq!(parse_size("16MB"), Ok(16 << 20));
        assert_eq!(parse_size("3"), Ok(3));
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert!(parse_algo("bogus").is_err());
    }
}
