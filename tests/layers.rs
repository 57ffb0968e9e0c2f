//! The library's layers point one way (docs/architecture.md). This test reads the
//! `crate::` paths in the code of every file under src/ (comments skipped), builds the
//! graph of top-level modules, and fails on
//! - an edge from a layer to a layer above it (the table below is the order),
//! - any cycle between top-level modules (leaves included),
//! - a top-level module missing from the table (new modules take a place in it),
//! - `unsafe` outside FFI, kernel launches, the borrow table and the C ABI: every module
//!   root outside those says `#![forbid(unsafe_code)]`, and inside them every file that
//!   has no `unsafe` says it too.
//!
//! It also checks that the files of each folder of src/ and tools/src/ import each other
//! without a cycle (the crate roots tools/src/lib.rs, tools/src/bin/*.rs and every folder
//! binary tools/src/bin/*/main.rs included; src/ itself is the layer table's), and names
//! each cycle: its files in order and, for each edge, the line that makes it. The rule:
//! - A folder's nodes are its files (its mod.rs, lib.rs or main.rs is one of them) and its
//!   subfolders: a nested folder is one node of its parent, and its own folder below.
//! - Each file's module path comes from the `mod x;` declarations (`#[path]` honoured)
//!   walked from the crate root. Every path in the code (comments and string literals
//!   skipped) that starts with `crate::`, `super::` or `self::`, or, in a file declaring
//!   child modules, with one of them (`child::f`, `pub use child::X`), is resolved to an
//!   absolute path; `use` groups `{a, b::c}` are expanded, and `super` in an inline module
//!   (`mod tests { use super::*; }`) leaves the inline module first. `mod child;` itself is
//!   no edge.
//! - The path names the file of its longest module prefix, except that an item the module
//!   file only imports (`use y::X`, `pub use y::X`, aliases, a `y::*` glob where y defines
//!   or imports X) is followed to where it comes from: `super::X` with X re-exported by
//!   mod.rs from sibling y is an edge to y; with X defined in mod.rs, an edge to mod.rs;
//!   `use super::*` outside an inline module, an edge to mod.rs.
//! - An edge between two files belongs to their lowest common folder, between the nodes
//!   holding them there.
//! `LAYERS_EDGES=src/algo cargo test --test layers folders -- --nocapture` prints the
//! edges of one folder. A folder in `PENDING` is printed but does not fail.

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

// Folders without cycles: the rule is in the doc comment at the top.

/// Folders (relative to the repository root) whose cycles are printed but tolerated while
/// their restructuring is under way. Keep it short; remove an entry once its folder is
/// acyclic (the test says when).
const PENDING: &[&str] = &[];

/// Comments, string and char literals blanked (newlines kept), so only code is scanned.
fn strip(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if c == b'r'
            && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
        {
            // Raw string r"..." / r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == b'"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&b'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            for &x in &b[i..j.min(b.len())] {
                blank(&mut out, x);
            }
            i = j;
        } else if c == b'"' {
            out.push(b' ');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    out.push(b' ');
                    i += 1;
                }
                if i < b.len() {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
            out.push(b' ');
            i += 1;
        } else if c == b'\'' {
            // A char literal ('a', '\n', '\u{1F}') or a lifetime ('a).
            let end = if b.get(i + 1) == Some(&b'\\') {
                (i + 2..b.len()).find(|&j| b[j] == b'\'')
            } else {
                let ch = text[i + 1..].chars().next().map_or(1, |c| c.len_utf8());
                (b.get(i + 1 + ch) == Some(&b'\'')).then_some(i + 1 + ch)
            };
            match end {
                Some(e) => {
                    for _ in i..=e {
                        out.push(b' ');
                    }
                    i = e + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[derive(Clone, Debug)]
struct Tok {
    s: String,
    line: usize,
}

fn tokenize(code: &str) -> Vec<Tok> {
    let mut out = Vec::new();
    for (n, l) in code.lines().enumerate() {
        let cs: Vec<char> = l.chars().collect();
        let mut i = 0;
        while i < cs.len() {
            let c = cs[i];
            if c.is_alphanumeric() || c == '_' || (c == '$' && i + 1 < cs.len()) {
                let st = i;
                i += 1;
                while i < cs.len() && (cs[i].is_alphanumeric() || cs[i] == '_') {
                    i += 1;
                }
                let s: String = cs[st..i].iter().collect();
                out.push(Tok {
                    s: if s == "$crate" { "crate".into() } else { s },
                    line: n + 1,
                });
            } else if c == ':' && cs.get(i + 1) == Some(&':') {
                out.push(Tok {
                    s: "::".into(),
                    line: n + 1,
                });
                i += 2;
            } else if !c.is_whitespace() {
                out.push(Tok {
                    s: c.to_string(),
                    line: n + 1,
                });
                i += 1;
            } else {
                i += 1;
            }
        }
    }
    out
}

fn is_ident(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// A path read at `toks[i]`: every full path it names (groups expanded), each with the
/// name it is bound to when it sits in a `use` (`as` aliases, `self` in groups).
fn read_path(
    toks: &[Tok],
    mut i: usize,
    prefix: &[String],
    out: &mut Vec<(Vec<String>, String)>,
) -> usize {
    let mut segs = prefix.to_vec();
    loop {
        let Some(t) = toks.get(i) else { break };
        if t.s == "{" {
            i += 1;
            while i < toks.len() && toks[i].s != "}" {
                if toks[i].s == "," {
                    i += 1;
                    continue;
                }
                if toks[i].s == "self" {
                    let alias = segs.last().cloned().unwrap_or_default();
                    out.push((segs.clone(), alias));
                    i += 1;
                    if toks.get(i).is_some_and(|t| t.s == "as") {
                        if let Some(a) = toks.get(i + 1) {
                            out.last_mut().unwrap().1 = a.s.clone();
                        }
                        i += 2;
                    }
                    continue;
                }
                let j = read_path(toks, i, &segs, out);
                i = if j == i { i + 1 } else { j };
            }
            return i + 1;
        } else if t.s == "*" {
            segs.push("*".into());
            i += 1;
            break;
        } else if is_ident(&t.s) {
            segs.push(t.s.clone());
            i += 1;
        } else {
            break;
        }
        if toks.get(i).is_some_and(|t| t.s == "::") {
            i += 1;
        } else {
            break;
        }
    }
    if segs.len() > prefix.len() {
        let mut alias = segs.last().cloned().unwrap_or_default();
        if toks.get(i).is_some_and(|t| t.s == "as") {
            if let Some(a) = toks.get(i + 1) {
                alias = a.s.clone();
            }
            i += 2;
        }
        out.push((segs, alias));
    }
    i
}

/// What the cycle check needs from one file.
#[derive(Default, Debug)]
struct FileScan {
    /// `mod x;` declarations (outside inline modules), with their `#[path]`.
    mods: Vec<(String, Option<String>)>,
    /// Top-level `use` bindings: bound name (`*` for a glob) and the path as written.
    uses: Vec<(String, Vec<String>)>,
    /// Names the file defines at top level.
    defs: BTreeSet<String>,
    /// Paths written in the code: path, the inline modules around it, line.
    refs: Vec<(Vec<String>, Vec<String>, usize)>,
}

fn scan(text: &str) -> FileScan {
    let raw: Vec<&str> = text.lines().collect();
    let toks = tokenize(&strip(text));
    let mut f = FileScan::default();
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let s = toks[i].s.as_str();
        let prev = if i > 0 { toks[i - 1].s.as_str() } else { "" };
        let next = toks.get(i + 1).map_or("", |t| t.s.as_str());
        let stack = || inline.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        match s {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|&(_, d)| d == depth) {
                    inline.pop();
                }
            }
            "mod" if is_ident(next) => {
                let after = toks.get(i + 2).map_or("", |t| t.s.as_str());
                if after == "{" {
                    inline.push((next.to_string(), depth));
                } else if after == ";" && inline.is_empty() {
                    // `#[path = "..."]` on this line or the attribute lines above it.
                    let line = toks[i].line;
                    let mut path = None;
                    let mut l = line;
                    while l >= 1 {
                        let r = raw[l - 1].trim();
                        if let Some(p) = r.find("#[path") {
                            let rest = &r[p..];
                            let q: Vec<&str> = rest.split('"').collect();
                            if q.len() >= 2 {
                                path = Some(q[1].to_string());
                            }
                        }
                        if l < line && !r.starts_with("#[") {
                            break;
                        }
                        l -= 1;
                    }
                    f.mods.push((next.to_string(), path));
                }
                if inline.is_empty() || after == "{" && inline.len() == 1 {
                    f.defs.insert(next.to_string());
                }
                i += 2;
                continue;
            }
            "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "union"
                if is_ident(next) && inline.is_empty() =>
            {
                f.defs.insert(next.to_string());
            }
            "macro_rules" if next == "!" && inline.is_empty() => {
                if let Some(t) = toks.get(i + 2) {
                    f.defs.insert(t.s.clone());
                }
            }
            "use" if prev != "::" => {
                let mut paths = Vec::new();
                let j = read_path(&toks, i + 1, &[], &mut paths);
                let st = stack();
                for (p, alias) in paths {
                    if inline.is_empty() {
                        let name = if p.last().is_some_and(|x| x == "*") {
                            "*".into()
                        } else {
                            alias
                        };
                        f.uses.push((name, p.clone()));
                    }
                    f.refs.push((p, st.clone(), toks[i].line));
                }
                i = j.max(i + 1);
                continue;
            }
            _ if is_ident(s) && prev != "::" && next == "::" => {
                let mut paths = Vec::new();
                let j = read_path(&toks, i, &[], &mut paths);
                let st = stack();
                for (p, _) in paths {
                    f.refs.push((p, st.clone(), toks[i].line));
                }
                i = j.max(i + 1);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    f
}

/// One crate's files: path (relative to the repository root), module path, scan.
struct Crate {
    files: Vec<(PathBuf, Vec<String>, FileScan)>,
    by_module: BTreeMap<Vec<String>, usize>,
}

/// Walks the `mod` declarations from `root` (a crate root file), reading through `read`.
fn load_crate(root: &Path, read: &dyn Fn(&Path) -> Option<String>) -> Crate {
    let mut c = Crate {
        files: Vec::new(),
        by_module: BTreeMap::new(),
    };
    let mut todo = vec![(root.to_path_buf(), Vec::<String>::new())];
    while let Some((file, module)) = todo.pop() {
        let Some(text) = read(&file) else { continue };
        let sc = scan(&text);
        let dir = file.parent().unwrap().to_path_buf();
        let is_root = module.is_empty() || file.file_name().is_some_and(|n| n == "mod.rs");
        let child_dir = if is_root {
            dir.clone()
        } else {
            dir.join(file.file_stem().unwrap())
        };
        for (name, path) in &sc.mods {
            let mut m = module.clone();
            m.push(name.clone());
            let candidates = match path {
                Some(p) => vec![dir.join(p)],
                None => vec![
                    child_dir.join(format!("{name}.rs")),
                    child_dir.join(name).join("mod.rs"),
                ],
            };
            if let Some(p) = candidates.into_iter().find(|p| read(p).is_some()) {
                todo.push((p, m));
            }
        }
        c.by_module.insert(module.clone(), c.files.len());
        c.files.push((file, module, sc));
    }
    c
}

impl Crate {
    /// The absolute module path `p` names, written in the module `cur` of file `fi`.
    fn absolute(
        &self,
        fi: usize,
        cur: &[String],
        inline: usize,
        p: &[String],
    ) -> Option<Vec<String>> {
        let first = p.first()?.as_str();
        let mut m = cur.to_vec();
        match first {
            "crate" => Some(p[1..].to_vec()),
            "super" => {
                let mut k = 0;
                while p.get(k).is_some_and(|s| s == "super") {
                    m.pop()?;
                    k += 1;
                }
                m.extend_from_slice(&p[k..]);
                Some(m)
            }
            "self" => {
                m.extend_from_slice(&p[1..]);
                Some(m)
            }
            // A bare path naming a child module declared by this file.
            _ if inline == 0 && self.files[fi].2.mods.iter().any(|(n, _)| n == first) => {
                m.extend_from_slice(p);
                Some(m)
            }
            _ => None,
        }
    }

    /// The file that an absolute path names, following imports (see the rule above).
    fn locate(&self, abs: &[String], hops: u32) -> Option<usize> {
        let k = (0..=abs.len())
            .rev()
            .find(|&k| self.by_module.contains_key(&abs[..k]))?;
        let fi = self.by_module[&abs[..k]];
        let Some(x) = abs.get(k).filter(|x| *x != "*" && hops < 8) else {
            return Some(fi);
        };
        let (_, module, sc) = &self.files[fi];
        let follow = |p: &[String], rest: &[String]| {
            let mut t = self.absolute(fi, module, 0, p)?;
            t.extend_from_slice(rest);
            self.locate(&t, hops + 1)
        };
        if let Some((_, p)) = sc.uses.iter().find(|(n, _)| n == x) {
            return follow(p, &abs[k + 1..]).or(Some(fi));
        }
        if sc.defs.contains(x) {
            return Some(fi);
        }
        for (_, p) in sc.uses.iter().filter(|(n, _)| n == "*") {
            let Some(mut g) = self.absolute(fi, module, 0, &p[..p.len() - 1]) else {
                continue;
            };
            let Some(&gi) = self.by_module.get(&g) else {
                continue;
            };
            let gs = &self.files[gi].2;
            if gs.defs.contains(x) || gs.uses.iter().any(|(n, _)| n == x) {
                g.extend_from_slice(&abs[k..]);
                return self.locate(&g, hops + 1).or(Some(fi));
            }
        }
        Some(fi)
    }
}

/// Edges between the nodes of each folder: folder -> from -> to -> one witness line.
type FolderGraph = BTreeMap<PathBuf, BTreeMap<String, BTreeMap<String, String>>>;

fn folder_edges(c: &Crate, g: &mut FolderGraph) {
    for (fi, (file, module, sc)) in c.files.iter().enumerate() {
        let dir = file.parent().unwrap();
        g.entry(dir.to_path_buf()).or_default();
        for (p, inline, line) in &sc.refs {
            let mut cur = module.clone();
            cur.extend_from_slice(inline);
            let Some(abs) = c.absolute(fi, &cur, inline.len(), p) else {
                continue;
            };
            let Some(ti) = c.locate(&abs, 0) else {
                continue;
            };
            if ti == fi {
                continue;
            }
            let to = &c.files[ti].0;
            let tdir = to.parent().unwrap();
            let common: PathBuf = dir
                .components()
                .zip(tdir.components())
                .take_while(|(a, b)| a == b)
                .map(|(a, _)| a)
                .collect();
            let node = |f: &Path| {
                let rel = f.strip_prefix(&common).unwrap();
                let mut comps = rel.components();
                let first = comps
                    .next()
                    .unwrap()
                    .as_os_str()
                    .to_string_lossy()
                    .into_owned();
                if comps.next().is_some() {
                    format!("{first}/")
                } else {
                    first
                }
            };
            let (a, b) = (node(file), node(to));
            let name = file.strip_prefix(&common).unwrap().display().to_string();
            g.entry(common.clone())
                .or_default()
                .entry(a)
                .or_default()
                .entry(b)
                .or_insert_with(|| format!("{name}:{line} `{}`", p.join("::")));
        }
    }
}

/// The strongly connected parts of more than one node, each with one cycle through its
/// first node (shortest), as the nodes in order and one witness line per edge.
fn folder_cycles(
    g: &BTreeMap<String, BTreeMap<String, String>>,
) -> Vec<(Vec<String>, Vec<String>)> {
    let reach = |from: &str| {
        let mut seen = BTreeSet::from([from.to_string()]);
        let mut todo = vec![from.to_string()];
        while let Some(n) = todo.pop() {
            for m in g.get(&n).into_iter().flat_map(|e| e.keys()) {
                if seen.insert(m.clone()) {
                    todo.push(m.clone());
                }
            }
        }
        seen
    };
    let nodes: BTreeSet<String> = g
        .iter()
        .flat_map(|(a, e)| std::iter::once(a.clone()).chain(e.keys().cloned()))
        .collect();
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|n| (n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for n in &nodes {
        if done.contains(n) {
            continue;
        }
        let scc: Vec<String> = nodes
            .iter()
            .filter(|m| reaches[n].contains(*m) && reaches[*m].contains(n))
            .cloned()
            .collect();
        done.extend(scc.iter().cloned());
        if scc.len() < 2 {
            continue;
        }
        // Shortest cycle through n, by breadth-first search inside the part.
        let mut prev: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([n.clone()]);
        'bfs: while let Some(x) = queue.pop_front() {
            for y in g.get(&x).into_iter().flat_map(|e| e.keys()) {
                if !scc.contains(y) {
                    continue;
                }
                if y == n {
                    prev.insert(n.clone() + "#", x.clone());
                    break 'bfs;
                }
                if !prev.contains_key(y) {
                    prev.insert(y.clone(), x.clone());
                    queue.push_back(y.clone());
                }
            }
        }
        let mut cyc = vec![n.clone()];
        let mut x = prev[&(n.clone() + "#")].clone();
        while &x != n {
            cyc.push(x.clone());
            x = prev[&x].clone();
        }
        cyc.push(n.clone());
        cyc.reverse();
        let mut lines = vec![cyc.join(" -> ")];
        lines.extend(
            cyc.windows(2)
                .map(|w| format!("  {} -> {}: {}", w[0], w[1], g[&w[0]][&w[1]])),
        );
        out.push((scc, lines));
    }
    out
}

/// Every crate root under src/ and tools/src/ (relative to `repo`).
fn crate_roots(repo: &Path) -> Vec<PathBuf> {
    let mut roots = vec![
        PathBuf::from("src/lib.rs"),
        PathBuf::from("tools/src/lib.rs"),
    ];
    let bin = repo.join("tools/src/bin");
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&bin)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        let rel = p.strip_prefix(repo).unwrap().to_path_buf();
        if p.is_dir() && p.join("main.rs").exists() {
            roots.push(rel.join("main.rs"));
        } else if p.extension().is_some_and(|x| x == "rs") {
            roots.push(rel);
        }
    }
    roots
}

/// The report of the folder check over the crates at `roots`: (failures, notes).
fn check_folders(
    roots: &[PathBuf],
    read: &dyn Fn(&Path) -> Option<String>,
    pending: &[&str],
) -> (Vec<String>, Vec<String>) {
    let mut g = FolderGraph::new();
    for r in roots {
        folder_edges(&load_crate(r, read), &mut g);
    }
    let (mut bad, mut notes) = (Vec::new(), Vec::new());
    let show = std::env::var("LAYERS_EDGES").unwrap_or_default();
    for (folder, edges) in &g {
        let name = folder.display().to_string();
        if name == show {
            for (a, tos) in edges {
                for (b, w) in tos {
                    println!("{a} -> {b}: {w}");
                }
            }
        }
        if name == "src" {
            continue; // the top-level modules: the layer table above checks them
        }
        let held = pending.contains(&name.as_str());
        let cycles = folder_cycles(edges);
        for (scc, lines) in &cycles {
            let head = format!(
                "cycle in {name}/ (files {}): {}",
                scc.join(", "),
                lines.join("\n")
            );
            if held {
                notes.push(format!("pending, not failing: {head}"));
            } else {
                bad.push(head);
            }
        }
        if held && cycles.is_empty() {
            notes.push(format!(
                "{name} is in PENDING but has no cycle now: remove it"
            ));
        }
    }
    for p in pending {
        if !g.contains_key(Path::new(p)) {
            notes.push(format!(
                "PENDING names {p}, which is not a folder of a crate"
            ));
        }
    }
    (bad, notes)
}

#[test]
fn folders_have_no_cycles() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &Path| std::fs::read_to_string(repo.join(p)).ok();
    let roots = crate_roots(repo);
    assert!(
        roots.iter().any(|r| r.ends_with("strata-perf/main.rs")),
        "{roots:?}"
    );
    let (bad, notes) = check_folders(&roots, &read, PENDING);
    for n in &notes {
        println!("{n}");
    }
    assert!(
        bad.is_empty(),
        "files of one folder import each other in a cycle:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_folder_check_names_a_cycle_and_passes_without_one() {
    let files = |extra: &str| {
        let mut m: BTreeMap<PathBuf, String> = BTreeMap::new();
        m.insert("src/lib.rs".into(), "pub mod a;\n".into());
        m.insert(
            "src/a/mod.rs".into(),
            "pub mod shape;\npub mod x;\nmod y;\n#[cfg(test)]\nmod tests;\npub use shape::Shape;\npub trait Run {}\n".into(),
        );
        m.insert(
            "src/a/shape.rs".into(),
            "pub struct Shape;\n// use super::x;\nconst S: &str = \"super::x::f\";\n".into(),
        );
        m.insert(
            "src/a/x.rs".into(),
            "use super::{Shape, Run};\npub fn f(_: Shape) {}\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n".into(),
        );
        m.insert(
            "src/a/y.rs".into(),
            format!("use crate::a::x;\nfn g() {{ x::f(super::Shape) }}\n{extra}"),
        );
        m.insert(
            "src/a/tests.rs".into(),
            "use super::*;\nuse super::y::*;\n".into(),
        );
        m
    };
    let check = |m: BTreeMap<PathBuf, String>| {
        let read = move |p: &Path| m.get(p).cloned();
        check_folders(&[PathBuf::from("src/lib.rs")], &read, &[]).0
    };
    // Acyclic: x and y use mod.rs's re-export of Shape (an edge to shape.rs, not mod.rs),
    // x uses Run from mod.rs; comments, strings and inline test modules are no edges.
    assert_eq!(check(files("")), Vec::<String>::new());
    // shape.rs calling back into x and y (a group): mod.rs re-exports Shape from shape.rs,
    // shape.rs uses x, x uses Run of mod.rs.
    let mut m = files("");
    m.insert(
        "src/a/shape.rs".into(),
        "use crate::a::{x::f, y};\npub struct Shape;\n".into(),
    );
    m.insert(
        "src/a/y.rs".into(),
        "pub fn h() { super::x::f(super::Shape) }\n".into(),
    );
    let bad = check(m).join("\n");
    assert!(
        bad.contains("cycle in src/a/ (files mod.rs, shape.rs, x.rs, y.rs)"),
        "{bad}"
    );
    assert!(
        bad.contains("mod.rs -> shape.rs -> x.rs -> mod.rs"),
        "{bad}"
    );
    assert!(
        bad.contains("  mod.rs -> shape.rs: mod.rs:6 `shape::Shape`"),
        "{bad}"
    );
    assert!(
        bad.contains("  shape.rs -> x.rs: shape.rs:1 `crate::a::x::f`"),
        "{bad}"
    );
    assert!(
        bad.contains("  x.rs -> mod.rs: x.rs:1 `super::Run`"),
        "{bad}"
    );
    // mod.rs using a child that uses a trait defined in mod.rs.
    let bad = check(files("pub fn k() { crate::a::x::f(crate::a::Shape) }\n"));
    assert!(bad.is_empty(), "{bad:?}");
    let mut m = files("");
    m.insert(
        "src/a/mod.rs".into(),
        m[Path::new("src/a/mod.rs")].clone() + "pub fn run() { x::f(Shape) }\n",
    );
    let bad = check(m).join("\n");
    assert!(bad.contains("mod.rs -> x.rs -> mod.rs"), "{bad}");
    assert!(bad.contains("x.rs -> mod.rs: x.rs:1 `super::Run`"), "{bad}");
    // A nested folder is one node of its parent.
    let mut m = files("");
    m.insert(
        "src/a/mod.rs".into(),
        m[Path::new("src/a/mod.rs")].clone() + "mod deep;\n",
    );
    m.insert("src/a/deep/mod.rs".into(), "mod leaf;\n".into());
    m.insert(
        "src/a/deep/leaf.rs".into(),
        "use super::super::y::g;\n".into(),
    );
    m.insert(
        "src/a/y.rs".into(),
        "pub fn g() { crate::a::deep::leaf::z() }\n".into(),
    );
    let bad = check(m).join("\n");
    assert!(bad.contains("cycle in src/a/ (files deep/, y.rs)"), "{bad}");
}
