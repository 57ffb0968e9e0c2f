//! The choice check: in a sweep that runs `auto` beside other algorithms, each (op,
//! dtype, redop, size) row's pick against the fastest algorithm measured there.
//!
//! `ratio` is the pick's own measured time over the fastest one's (1.00 when `auto`
//! picked the fastest; the `auto` row's own time, when the pick was not among the
//! sweep's algorithms); `auto_us` is the `auto` row itself, a second measurement of the
//! pick. Candidates are strata's exact algorithms of the sweep (not `mpi`, not the
//! quantized ones, which `auto` never picks).

use strata::Algo;

/// One timed row, as the check reads it.
pub(crate) struct Timed<'a> {
    pub(crate) op: &'a str,
    pub(crate) dtype: &'a str,
    pub(crate) redop: &'a str,
    pub(crate) size: u64,
    pub(crate) coalesce: Option<usize>,
    pub(crate) algo: &'a str,
    pub(crate) algo_used: &'a str,
    pub(crate) time_us: f64,
}

/// The check of one (op, dtype, redop, size).
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Checked {
    /// Index of the `auto` row among the rows checked.
    #[serde(skip)]
    pub(crate) auto_row: usize,
    pub(crate) pick: String,
    pub(crate) fastest: String,
    pub(crate) auto_us: f64,
    pub(crate) pick_us: f64,
    pub(crate) fastest_us: f64,
    pub(crate) ratio: f64,
}

fn candidate(name: &str) -> bool {
    name.parse::<Algo>()
        .is_ok_and(|a| a != Algo::Auto && Algo::LOSSLESS.contains(&a))
}

/// Every `auto` row of `rows` with at least one candidate beside it.
pub(crate) fn check(rows: &[Timed]) -> Vec<Checked> {
    let mut out = Vec::new();
    for (i, a) in rows.iter().enumerate().filter(|(_, r)| r.algo == "auto") {
        let same = |r: &&Timed| {
            (r.op, r.dtype, r.redop, r.size, r.coalesce)
                == (a.op, a.dtype, a.redop, a.size, a.coalesce)
        };
        let peers: Vec<&Timed> = rows
            .iter()
            .filter(same)
            .filter(|r| candidate(r.algo))
            .collect();
        let Some(fastest) = peers.iter().min_by(|x, y| x.time_us.total_cmp(&y.time_us)) else {
            continue;
        };
        let pick_us = peers
            .iter()
            .find(|r| r.algo == a.algo_used)
            .map_or(a.time_us, |r| r.time_us);
        out.push(Checked {
            auto_row: i,
            pick: a.algo_used.to_string(),
            fastest: fastest.algo.to_string(),
            auto_us: a.time_us,
            pick_us,
            fastest_us: fastest.time_us,
            ratio: pick_us / fastest.time_us.max(1e-9),
        });
    }
    out
}

/// The table's lines, then the summary: rows within 10% and the worst ratio.
pub(crate) fn lines(rows: &[Timed], checks: &[Checked]) -> Vec<String> {
    if checks.is_empty() {
        return Vec::new();
    }
    let mut v = vec![
        "#".to_string(),
        "# auto check: the pick against the fastest algorithm measured (ratio: the pick's time / the fastest's)".to_string(),
        format!(
            "# {:>16} {:>12} {:>6} {:>9} {:>9} {:>11} {:>11} {:>11} {:>6}",
            "op", "size", "type", "pick", "fastest", "auto_us", "pick_us", "fastest_us", "ratio"
        ),
    ];
    for c in checks {
        let r = &rows[c.auto_row];
        v.push(format!(
            "  {:>16} {:>12} {:>6} {:>9} {:>9} {:>11.1} {:>11.1} {:>11.1} {:>6.2}",
            r.op, r.size, r.dtype, c.pick, c.fastest, c.auto_us, c.pick_us, c.fastest_us, c.ratio
        ));
    }
    let within = checks.iter().filter(|c| c.ratio <= 1.10).count();
    let worst = checks.iter().map(|c| c.ratio).fold(1.0, f64::max);
    v.push(format!(
        "# auto within 10% of the fastest in {within}/{} rows ({:.0}%), worst {worst:.2}x",
        checks.len(),
        100.0 * within as f64 / checks.len() as f64
    ));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t<'a>(algo: &'a str, used: &'a str, size: u64, us: f64) -> Timed<'a> {
        Timed {
            op: "all-gather",
            dtype: "float",
            redop: "none",
            size,
            coalesce: None,
            algo,
            algo_used: used,
            time_us: us,
        }
    }

    #[test]
    fn picks_are_checked_against_the_fastest_candidate() {
        let rows = [
            t("ring", "ring", 64, 10.0),
            t("log-step", "log-step", 64, 5.0),
            t("mpi", "mpi", 64, 1.0),
            t("qwz", "qwz", 64, 0.5),
            t("auto", "ring", 64, 9.0),
            t("ring", "ring", 128, 10.0),
            t("auto", "hier", 128, 12.0),
            t("auto", "ring", 256, 3.0),
        ];
        let c = check(&rows);
        assert_eq!(c.len(), 2, "the 256-byte row has no candidate");
        assert_eq!(
            (c[0].pick.as_str(), c[0].fastest.as_str()),
            ("ring", "log-step")
        );
        assert_eq!(c[0].ratio, 2.0);
        // hier was not measured: the auto row's own time stands for it.
        assert_eq!(c[1].ratio, 1.2);
        let l = lines(&rows, &c);
        assert!(l.last().unwrap().contains("0/2 rows"), "{l:?}");
    }
}
