//! The tools' report lines on stdout. A closed stdout (`strata-sim ... | head`) ends the
//! tool quietly with status 0, as a Unix filter ends on SIGPIPE, instead of Rust's
//! `println!` panic ("failed printing to stdout").

use std::io::{ErrorKind, Write};

/// Writes one line to stdout; see the module doc for a closed stdout.
pub fn line(args: std::fmt::Arguments<'_>) {
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_fmt(args).and_then(|_| o.write_all(b"\n")) {
        if e.kind() == ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
    }
}

/// `println!` for a tool's report lines, through [`line`].
#[macro_export]
macro_rules! outln {
    () => {
        $crate::out::line(format_args!(""))
    };
    ($($t:tt)*) => {
        $crate::out::line(format_args!($($t)*))
    };
}
