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

/// A size in bytes as nccl-tests writes it: an integer, optionally followed by K, M, G
/// or T (powers of 1024) and an optional `B`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix(['b', 'B'])
        .filter(|r| !r.is_empty())
        .unwrap_or(t);
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        Some('T') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| {
            format!("'{s}' is not a size in bytes (an integer, optionally followed by K, M or G)")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

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
