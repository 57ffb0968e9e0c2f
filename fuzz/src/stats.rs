//! Process-wide counters of a fuzz run and the summary table.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{LazyLock, Mutex};

#[derive(Default)]
pub struct Stats {
    pub calls: AtomicU64,
    pub checked: AtomicU64,
    pub worlds: AtomicU64,
    pub breaks: AtomicU64,
    pub internal: AtomicU64,
    paths: Mutex<BTreeMap<(&'static str, i32), u64>>,
    messages: Mutex<BTreeSet<String>>,
    failures: Mutex<Vec<String>>,
}

pub static STATS: LazyLock<Stats> = LazyLock::new(Stats::default);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A message with its numbers (handles, counts, ranks, sizes) replaced by `#`, so that
/// messages differing only in values count once.
pub fn normalise(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut chars = msg.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || (c == '-' && chars.peek().is_some_and(|d| d.is_ascii_digit())) {
            while chars
                .peek()
                .is_some_and(|d| d.is_ascii_hexdigit() || *d == 'x' || *d == '.')
            {
                chars.next();
            }
            out.push('#');
        } else {
            out.push(c);
        }
    }
    out
}

impl Stats {
    pub fn call(&self) {
        self.calls.fetch_add(1, Relaxed);
    }
    pub fn checked(&self) {
        self.checked.fetch_add(1, Relaxed);
    }
    pub fn internal(&self) {
        self.internal.fetch_add(1, Relaxed);
    }
    pub fn error(&self, function: &'static str, code: i32, normalised: &str) {
        *lock(&self.paths).entry((function, code)).or_default() += 1;
        let mut m = lock(&self.messages);
        if !m.contains(normalised) {
            m.insert(normalised.to_string());
        }
    }
    pub fn fail(&self, what: String) {
        let mut f = lock(&self.failures);
        if f.len() < 50 {
            f.push(what);
        }
    }
    /// The failures recorded so far, emptied.
    pub fn take_failures(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.failures))
    }
    pub fn paths(&self) -> usize {
        lock(&self.paths).len()
    }
    pub fn messages(&self) -> Vec<String> {
        lock(&self.messages).iter().cloned().collect()
    }

    /// The summary table: totals, then every (function, code) pair with its count.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let paths = lock(&self.paths);
        let msgs = lock(&self.messages).len();
        let mut s = String::new();
        for (name, n) in [
            ("calls", &self.calls),
            ("valid collectives checked", &self.checked),
            ("worlds built", &self.worlds),
            ("world-breaking events", &self.breaks),
            ("internal errors (panics)", &self.internal),
        ] {
            let _ = writeln!(s, "{name:<27}{}", n.load(Relaxed));
        }
        let _ = writeln!(s, "distinct (function, code)  {}", paths.len());
        let _ = writeln!(s, "distinct error messages    {msgs} (numbers normalised)");
        let _ = writeln!(s, "{:<32} {:>4} {:>10}", "function", "code", "failures");
        for ((f, c), n) in paths.iter() {
            let _ = writeln!(s, "{f:<32} {c:>4} {n:>10}");
        }
        s
    }
}
