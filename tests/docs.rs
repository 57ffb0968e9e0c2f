//! The docs' cheap checks (the expensive half, running every command they show, is
//! `scripts/doc-commands`): README.md stays a front page, relative links in README.md
//! and docs/*.md point to files that exist, and papers are cited by name and section,
//! never by the number of their file in the seed collection.

use std::fs;
use std::path::{Path, PathBuf};

const README_MAX_LINES: usize = 250;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every docs/*.md.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// Every `](target)` of a markdown text outside fenced code blocks, with its line.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_code = false;
    for (no, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((no + 1, after[..end].trim().to_string()));
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn readme_is_a_front_page() {
    let text = fs::read_to_string(root().join("README.md")).expect("README.md");
    let n = text.lines().count();
    assert!(
        n <= README_MAX_LINES,
        "README.md has {n} lines, more than {README_MAX_LINES}: move the detail to a page in docs/"
    );
}

#[test]
fn relative_links_point_to_files() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = fs::read_to_string(&page).expect("page");
        let dir = page.parent().expect("page dir");
        for (line, target) in links(&text) {
            let target = target.split_whitespace().next().unwrap_or("");
            if target.is_empty()
                || target.starts_with('#')
                || target.contains("://")
                || target.starts_with("mailto:")
            {
                continue;
            }
            let path = target.split('#').next().unwrap_or("");
            if !dir.join(path).exists() {
                broken.push(format!(
                    "{}:{line}: {target}",
                    page.strip_prefix(root()).unwrap_or(&page).display()
                ));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "links to missing files:\n{}",
        broken.join("\n")
    );
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "md" || e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn papers_are_cited_by_name() {
    let mut files = vec![root().join("README.md")];
    walk(&root().join("src"), &mut files);
    walk(&root().join("docs"), &mut files);
    let needle = ["seed", " 0"].concat(); // spelled apart so this file does not match itself
    let mut hits = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).expect("file");
        for (no, line) in text.lines().enumerate() {
            if line.to_lowercase().contains(&needle) {
                hits.push(format!(
                    "{}:{}: {}",
                    file.strip_prefix(root()).unwrap_or(&file).display(),
                    no + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        hits.is_empty(),
        "cite the paper by name and section (MiCS §3.3, ZeRO++ §4.2, PaRO §3, AMSP §IV-B, the Frontier ZeRO paper §IV), not its seed number:\n{}",
        hits.join("\n")
    );
}
