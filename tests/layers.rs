//! The library's layers point one way (docs/architecture.md). This test reads the
//! `crate::` paths in the code of every file under src/ (comments skipped), builds the
//! graph of top-level modules, and fails on
//! - an edge from a layer to a layer above it (the table below is the order),
//! - any cycle between top-level modules (leaves included),
//! - a top-level module missing from the table (new modules take a place in it),
//! - `unsafe` outside FFI, kernel launches, the borrow table and the C ABI: every module
//!   root outside those says `#![forbid(unsafe_code)]`, and inside them every file that
//!   has no `unsafe` says it too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level modules, lowest layer first. Rank 0 are the leaves, usable by all (they may
/// use each other, but not in a cycle).
const LAYERS: &[(&str, u32)] = &[
    ("error", 0),
    ("dtype", 0),
    ("kinds", 0),
    ("config", 0),
    ("log", 0),
    ("units", 0),
    ("topology", 0),
    ("kernels", 1),
    ("traffic", 1),
    ("kernels_gpu", 2),
    ("device", 3),
    ("memory", 4),
    ("transport", 5),
    ("bufops", 6),
    ("runtime", 7),
    ("algo", 8),
    ("sim", 9),
    ("comm", 10),
    ("check", 11),
    ("capi", 12),
];

/// Modules (and files) where `unsafe` may appear: FFI, kernel launches, the buffer
/// borrow table, the C ABI.
const UNSAFE_OK: &[&str] = &["transport", "device", "kernels_gpu", "memory", "capi"];

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file under src/ belongs to (`None`: the crate root).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    let m = first.trim_end_matches(".rs").to_string();
    (m != "lib" && m != "bin").then_some(m)
}

/// Code lines only: line comments and doc comments dropped, trailing comments cut.
fn code(text: &str) -> String {
    text.lines()
        .map(|l| {
            let t = l.trim_start();
            if t.starts_with("//") {
                ""
            } else {
                l.split(" //").next().unwrap_or("")
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `crate::x` targets named in `code` (including `crate::{x, y::z}` groups).
fn targets(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + 7..];
        if let Some(group) = after.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        } else {
            let name: String = after
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
        rest = after;
    }
    out
}

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Edges between top-level modules of the crate at `src`, with one file naming each.
fn graph(src: &Path) -> (Graph, BTreeMap<(String, String), PathBuf>) {
    let mut files = Vec::new();
    rs_files(src, &mut files);
    let mut g = Graph::new();
    let mut witness = BTreeMap::new();
    for f in files {
        let Some(m) = module_of(src, &f) else {
            continue;
        };
        let text = std::fs::read_to_string(&f).unwrap();
        g.entry(m.clone()).or_default();
        for t in targets(&code(&text)) {
            // Crate-root re-exports (`crate::Buffer`) are not modules.
            if t.chars().next().is_some_and(|c| c.is_uppercase()) || t == m {
                continue;
            }
            witness.entry((m.clone(), t.clone())).or_insert(f.clone());
            g.entry(m.clone()).or_default().insert(t);
        }
    }
    (g, witness)
}

/// One cycle of `g`, as a path that starts and ends at the same module.
fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    fn dfs(
        g: &Graph,
        n: &str,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| s == m).unwrap();
                    let mut c = stack[at..].to_vec();
                    c.push(m.clone());
                    return Some(c);
                }
                0 => {
                    if let Some(c) = dfs(g, m, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            if let Some(c) = dfs(g, n, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// Every violation of the layer table in `g`.
fn violations(g: &Graph, witness: &BTreeMap<(String, String), PathBuf>) -> Vec<String> {
    let rank: BTreeMap<&str, u32> = LAYERS.iter().copied().collect();
    let mut bad = Vec::new();
    for (from, tos) in g {
        let Some(&rf) = rank.get(from.as_str()) else {
            bad.push(format!(
                "module `{from}` has no place in the layer table of tests/layers.rs"
            ));
            continue;
        };
        for to in tos {
            let Some(&rt) = rank.get(to.as_str()) else {
                continue; // not a module of ours (e.g. a macro path)
            };
            if rt > rf || (rt == rf && rf != 0) {
                bad.push(format!(
                    "`{from}` (layer {rf}) uses `{to}` (layer {rt}), a layer not below it: {}",
                    witness[&(from.clone(), to.clone())].display()
                ));
            }
        }
    }
    if let Some(c) = find_cycle(g) {
        bad.push(format!("cycle between modules: {}", c.join(" -> ")));
    }
    bad
}

#[test]
fn layers_point_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (g, witness) = graph(&src);
    for m in ["comm", "algo", "runtime", "transport", "topology"] {
        assert!(
            g.contains_key(m),
            "module {m} not found: is the scan broken?"
        );
    }
    let bad = violations(&g, &witness);
    assert!(bad.is_empty(), "layering broken:\n{}", bad.join("\n"));
}

#[test]
fn the_checker_sees_cycles_and_upward_edges() {
    let edge = |a: &str, b: &str| (a.to_string(), b.to_string());
    let mut g = Graph::new();
    let mut w = BTreeMap::new();
    for (a, b) in [
        ("comm", "algo"),
        ("algo", "runtime"),
        ("runtime", "transport"),
    ] {
        g.entry(a.to_string()).or_default().insert(b.to_string());
        w.insert(edge(a, b), PathBuf::from("x.rs"));
    }
    assert!(violations(&g, &w).is_empty());
    // An algorithm calling back into the front: upward edge and cycle.
    g.entry("algo".into()).or_default().insert("comm".into());
    w.insert(edge("algo", "comm"), PathBuf::from("src/algo/x.rs"));
    let bad = violations(&g, &w).join("\n");
    assert!(bad.contains("`algo` (layer 8) uses `comm`"), "{bad}");
    assert!(bad.contains("cycle between modules"), "{bad}");
    // Two leaves using each other: no upward edge, but a cycle.
    let mut g = Graph::new();
    g.entry("config".into()).or_default().insert("kinds".into());
    g.entry("kinds".into()).or_default().insert("config".into());
    assert!(find_cycle(&g).is_some());
    // The scanner: comments are not edges, groups are.
    let t = targets(&code(
        "use crate::{algo::x, comm};\n// crate::capi\n/// [`crate::sim`]\nlet a = crate::dtype::F; // crate::check",
    ));
    assert_eq!(t.into_iter().collect::<Vec<_>>(), ["algo", "comm", "dtype"]);
}

#[test]
fn unsafe_only_where_it_belongs() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let mut bad = Vec::new();
    for f in files {
        let Some(m) = module_of(&src, &f) else {
            continue;
        };
        let text = std::fs::read_to_string(&f).unwrap();
        let forbids = text.contains("#![forbid(unsafe_code)]");
        let root =
            f.file_name().is_some_and(|n| n == "mod.rs") || f.parent() == Some(src.as_path());
        let uses_unsafe = code(&text)
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|w| w == "unsafe");
        if UNSAFE_OK.contains(&m.as_str()) {
            // Inside FFI modules: a file without unsafe code forbids it (a module root
            // cannot, since the forbid would cover its FFI children).
            if !uses_unsafe && !forbids && !(root && f.parent() != Some(src.as_path())) {
                bad.push(format!(
                    "{} has no unsafe code but does not forbid it",
                    f.display()
                ));
            }
        } else if root && !forbids {
            bad.push(format!(
                "{} (module `{m}`) must say #![forbid(unsafe_code)]",
                f.display()
            ));
        } else if uses_unsafe {
            bad.push(format!(
                "{} uses unsafe outside FFI/kernels/memory/capi",
                f.display()
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
