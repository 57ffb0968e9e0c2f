//! What strata-perf prints with: nccl-tests' time format and a line to stdout.

use std::io::Write;

/// nccl-tests' time format: fewer decimals as the number grows.
pub(crate) fn fmt_time(us: f64) -> String {
    if us >= 10000.0 {
        format!("{us:7.0}")
    } else if us >= 100.0 {
        format!("{us:7.1}")
    } else {
        format!("{us:7.2}")
    }
}

/// One line to stdout.
pub(crate) fn out(line: &str) {
    // A closed stdout (`| head`) must not panic the benchmark.
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}
