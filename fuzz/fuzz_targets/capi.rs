//! Coverage-guided fuzz target of the C ABI: each input is one call script
//! (`strata_fuzz::run_script`); a failed check panics (a libFuzzer crash). Run with
//! `cargo +nightly fuzz run capi` from `fuzz/` (see docs/testing.md).

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::Once;
use std::time::Duration;
use strata_fuzz::{run_script, setup, watchdog, Opts};

static SETUP: Once = Once::new();

fn opts() -> Opts {
    Opts {
        max_steps: 12,
        max_worlds: 3,
        ..Opts::default()
    }
}

fuzz_target!(|data: &[u8]| {
    SETUP.call_once(|| {
        setup(&opts());
        watchdog(Duration::from_secs(30), || {
            "the current libFuzzer input".into()
        });
    });
    let failures = run_script(data, &opts(), "input");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
});
