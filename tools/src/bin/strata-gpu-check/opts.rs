//! The command line: the options and the help text.

pub(crate) struct Opts {
    pub(crate) quick: bool,
    pub(crate) no_bench: bool,
    pub(crate) bench_only: bool,
    pub(crate) tune: bool,
    pub(crate) no_compiled: bool,
    pub(crate) compiled_timeout: u64,
    pub(crate) verbose: bool,
    pub(crate) iters: usize,
    pub(crate) warm: usize,
    pub(crate) seed: u64,
    pub(crate) bench_n: usize,
}
