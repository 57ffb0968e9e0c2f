//! SVG plot of modeled time against message size (log-log), one polyline per series
//! (algorithm), hand-written SVG 1.1 (no dependencies).

use std::fmt::Write;

/// One line of the plot: `points` are (message size in bytes, time in us), both > 0.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

const W: f64 = 820.0;
const H: f64 = 520.0;
const LEFT: f64 = 86.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 48.0;
const BOTTOM: f64 = 62.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `1K`, `64M`, `1G` for powers of two; plain bytes otherwise.
pub fn size_label(b: f64) -> String {
    let units = [
        (1u64 << 40, "T"),
        (1 << 30, "G"),
        (1 << 20, "M"),
        (1 << 10, "K"),
    ];
    for (u, n) in units {
        let u = u as f64;
        if b >= u {
            let v = b / u;
            return if (v - v.round()).abs() < 1e-9 {
                format!("{}{n}", v.round())
            } else {
                format!("{v:.1}{n}")
            };
        }
    }
    format!("{}", b.round())
}

/// `1 us`, `10 us`, `100 us`, `1 ms`, ... for powers of ten of microseconds.
pub fn time_label(us: f64) -> String {
    if us >= 1e6 {
        format!("{} s", trim(us / 1e6))
    } else if us >= 1e3 {
        format!("{} ms", trim(us / 1e3))
    } else {
        format!("{} us", trim(us))
    }
}

fn trim(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round())
    } else {
        format!("{v}")
    }
}

/// The plot as an SVG document: log2 x axis (size) with ticks at powers of two (every
/// second or fourth one when the range is wide), log10 y axis (time) with a tick per
/// decade, grid lines, one polyline with point markers per series, and a legend.
pub fn svg(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let pts: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|&(x, y)| x > 0.0 && y > 0.0 && x.is_finite() && y.is_finite())
        .collect();
    let (mut x0, mut x1, mut y0, mut y1) = pts.iter().fold(
        (
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ),
        |a, &(x, y)| (a.0.min(x), a.1.max(x), a.2.min(y), a.3.max(y)),
    );
    if pts.is_empty() {
        (x0, x1, y0, y1) = (1.0, 1024.0, 1.0, 1000.0);
    }
    let (lx0, mut lx1) = (x0.log2().floor(), x1.log2().ceil());
    if lx1 <= lx0 {
        lx1 = lx0 + 1.0;
    }
    let (ly0, mut ly1) = (y0.log10().floor(), y1.log10().ceil());
    if ly1 <= ly0 {
        ly1 = ly0 + 1.0;
    }
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let px = |x: f64| LEFT + (x.log2() - lx0) / (lx1 - lx0) * pw;
    let py = |y: f64| TOP + ph - (y.log10() - ly0) / (ly1 - ly0) * ph;

    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<rect x="0" y="0" width="{W}" height="{H}" fill="white"/>
<text x="{}" y="26" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        LEFT + pw / 2.0,
        esc(title)
    );
    // Grid, ticks and labels.
    let span = (lx1 - lx0) as usize;
    let step = if span <= 12 {
        1
    } else if span <= 24 {
        2
    } else {
        4
    };
    let mut e = lx0 as i64;
    while e as f64 <= lx1 {
        if (e - lx0 as i64) % step as i64 == 0 {
            let x = px(2f64.powi(e as i32));
            let _ = writeln!(
                o,
                r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#e0e0e0"/><line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="black"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                TOP + ph,
                TOP + ph,
                TOP + ph + 5.0,
                TOP + ph + 19.0,
                size_label(2f64.powi(e as i32))
            );
        }
        e += 1;
    }
    let mut d = ly0 as i64;
    while d as f64 <= ly1 {
        let v = 10f64.powi(d as i32);
        let y = py(v);
        let _ = writeln!(
            o,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e0e0e0"/><line x1="{:.1}" y1="{y:.1}" x2="{LEFT}" y2="{y:.1}" stroke="black"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 5.0,
            LEFT - 8.0,
            y + 4.0,
            time_label(v)
        );
        // Minor ticks at 2..9 x the decade.
        if (d as f64) < ly1 {
            for m in 2..10 {
                let y = py(v * m as f64);
                let _ = writeln!(
                    o,
                    r##"<line x1="{:.1}" y1="{y:.1}" x2="{LEFT}" y2="{y:.1}" stroke="black"/>"##,
                    LEFT - 3.0
                );
            }
        }
        d += 1;
    }
    let _ = writeln!(
        o,
        r#"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>
<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>
<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">{}</text>"#,
        LEFT + pw / 2.0,
        H - 16.0,
        esc(x_label),
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        esc(y_label)
    );
    // Series.
    for (k, s) in series.iter().enumerate() {
        let c = COLORS[k % COLORS.len()];
        let p: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|&(x, y)| x > 0.0 && y > 0.0 && x.is_finite() && y.is_finite())
            .map(|(x, y)| (px(x), py(y)))
            .collect();
        let line: Vec<String> = p.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let _ = writeln!(
            o,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"><title>{}</title></polyline>"#,
            line.join(" "),
            esc(&s.name)
        );
        for (x, y) in &p {
            let _ = writeln!(o, r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{c}"/>"#);
        }
        let ly = TOP + 14.0 + 22.0 * k as f64;
        let lx = LEFT + pw + 16.0;
        let _ = writeln!(
            o,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{c}" stroke-width="2"/><circle cx="{:.1}" cy="{ly:.1}" r="3" fill="{c}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 28.0,
            lx + 14.0,
            lx + 36.0,
            ly + 4.0,
            esc(&s.name)
        );
    }
    o.push_str("</svg>\n");
    o
}
