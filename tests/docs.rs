//! The docs' cheap checks (the expensive half, running every command they show, is
//! `scripts/doc-commands`): README.md stays a front page (at most about 120 lines, its
//! sections in a reader's order, sentences short enough to read at once), relative links
//! in README.md and docs/*.md point to files and headings that exist, and papers are
//! cited by name and section, never by the number of their file in the seed collection.

use std::fs;
use std::path::{Path, PathBuf};

const README_MAX_LINES: usize = 120;

/// The front page's sections, in the order a new user asks their questions: what it is
/// and the two commands come first, above every heading.
const README_SECTIONS: [&str; 6] = [
    "## Install",
    "## What it does",
    "## A short tour",
    "## Status",
    "## Documentation",
    "## Dependencies and why",
];

/// The most words one sentence of README.md's prose may have.
const README_MAX_SENTENCE_WORDS: usize = 40;

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

/// The prose of a markdown text: paragraphs outside code blocks, tables, headings and
/// list markers, each paragraph's lines joined.
fn paragraphs(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_code = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code || t.starts_with('|') || t.starts_with('#') || t.is_empty() {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            continue;
        }
        let t = t.trim_start_matches("- ");
        cur.push(' ');
        cur.push_str(t);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[test]
fn readme_sections_in_order() {
    let text = fs::read_to_string(root().join("README.md")).expect("README.md");
    let mut at = 0;
    for want in README_SECTIONS {
        let found = text.lines().position(|l| l.trim_end() == want);
        let Some(line) = found else {
            panic!("README.md has no section `{want}`");
        };
        assert!(
            line >= at,
            "README.md: `{want}` (line {}) comes before a section that should precede it",
            line + 1
        );
        at = line;
    }
    let first_heading = text
        .lines()
        .skip(1)
        .position(|l| l.starts_with("## "))
        .expect("a section");
    let head: String = text
        .lines()
        .take(first_heading + 1)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        head.contains("```sh") && head.contains("\nscripts/test\n"),
        "README.md: the two commands (run the main job, `scripts/test`) come before the first section"
    );
}

#[test]
fn readme_sentences_are_short() {
    let text = fs::read_to_string(root().join("README.md")).expect("README.md");
    let mut long = Vec::new();
    for p in paragraphs(&text) {
        for sentence in p.split_inclusive(". ") {
            let words = sentence.split_whitespace().count();
            if words > README_MAX_SENTENCE_WORDS {
                long.push(format!("{words} words: {}", sentence.trim()));
            }
        }
    }
    assert!(
        long.is_empty(),
        "README.md sentences over {README_MAX_SENTENCE_WORDS} words; split them:\n{}",
        long.join("\n")
    );
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors a page's headings make (a repeated heading gets `-1`, `-2`, ...).
fn anchors(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim_end_matches('#'));
        let seen = out
            .iter()
            .filter(|a| {
                **a == base
                    || a.strip_prefix(&format!("{base}-"))
                        .is_some_and(|n| n.parse::<u32>().is_ok())
            })
            .count();
        out.push(if seen == 0 {
            base
        } else {
            format!("{base}-{seen}")
        });
    }
    out
}

#[test]
fn anchors_point_to_headings() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = fs::read_to_string(&page).expect("page");
        let dir = page.parent().expect("page dir");
        for (line, target) in links(&text) {
            let target = target.split_whitespace().next().unwrap_or("");
            let Some((file, anchor)) = target.split_once('#') else {
                continue;
            };
            if target.contains("://") {
                continue;
            }
            let linked = if file.is_empty() {
                page.clone()
            } else {
                dir.join(file)
            };
            if linked.extension().is_none_or(|e| e != "md") {
                continue;
            }
            let Ok(linked_text) = fs::read_to_string(&linked) else {
                continue;
            };
            if !anchors(&linked_text).iter().any(|a| a == anchor) {
                broken.push(format!(
                    "{}:{line}: {target}",
                    page.strip_prefix(root()).unwrap_or(&page).display()
                ));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "links to headings that do not exist:\n{}",
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
