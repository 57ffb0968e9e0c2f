//! `STRATA_DEBUG`: strata's `tracing` events on stderr, NCCL_DEBUG style.
//!
//! `STRATA_DEBUG=WARN|INFO|TRACE` (alone or in a comma list with `check`, which
//! [`crate::config`] reads) installs, once per process and only if the program has
//! no global subscriber of its own, a small subscriber that prints strata's events at
//! that level or above as `hostname:pid:thread strata LEVEL message key=value ...`
//! (INFO also shows DEBUG events: which algorithm, which groups, which sizes). A Rust
//! program that wants its own formatting installs any `tracing` subscriber first and
//! leaves `STRATA_DEBUG` unset.
//!
//! This is a few lines rather than `tracing-subscriber` so that a C or Python program
//! linking the library pulls in no formatting or filtering crates.

#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::io::Write as _;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Install the stderr subscriber if `STRATA_DEBUG` asks for one (once; later calls
/// do nothing).
pub fn init() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let v = std::env::var("STRATA_DEBUG").unwrap_or_default();
        if let Some(max) = level(&v) {
            let _ = tracing::subscriber::set_global_default(Stderr { max });
        }
    });
}

/// The most verbose level `STRATA_DEBUG=value` shows (`None`: logging off): the most
/// verbose level name in the comma list (other names, such as `check`, are not levels).
pub fn level(value: &str) -> Option<Level> {
    value
        .split(',')
        .filter_map(|t| match t.trim().to_ascii_uppercase().as_str() {
            "TRACE" => Some(Level::TRACE),
            "INFO" => Some(Level::DEBUG),
            "WARN" => Some(Level::WARN),
            _ => None,
        })
        .max()
}

struct Stderr {
    max: Level,
}

struct Fields(String, String);

impl Visit for Fields {
    fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
        if f.name() == "message" {
            let _ = write!(self.0, "{v:?}");
        } else {
            let _ = write!(self.1, " {}={v:?}", f.name());
        }
    }
    fn record_str(&mut self, f: &Field, v: &str) {
        if f.name() == "message" {
            self.0.push_str(v);
        } else {
            let _ = write!(self.1, " {}={v}", f.name());
        }
    }
}

impl Subscriber for Stderr {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        m.target().starts_with("strata") && *m.level() <= self.max
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, e: &Event<'_>) {
        let mut f = Fields(String::new(), String::new());
        e.record(&mut f);
        let host = std::env::var("HOSTNAME").unwrap_or_default();
        let t = std::thread::current();
        let line = format!(
            "{host}:{}:{} strata {} {}{}\n",
            std::process::id(),
            t.name().unwrap_or("-"),
            e.metadata().level(),
            f.0,
            f.1
        );
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_follow_nccl_debug_names() {
        assert_eq!(level("info"), Some(Level::DEBUG));
        assert_eq!(level(" WARN "), Some(Level::WARN));
        assert_eq!(level("TRACE"), Some(Level::TRACE));
        assert_eq!(level(""), None);
        assert_eq!(level("VERSION"), None);
        assert_eq!(level("check"), None);
        assert_eq!(level("INFO,check"), Some(Level::DEBUG));
        assert_eq!(level("check, warn"), Some(Level::WARN));
        assert_eq!(level("WARN,TRACE"), Some(Level::TRACE));
    }
}
