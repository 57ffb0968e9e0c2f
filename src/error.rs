//! The one error type of strata and its mapping to NCCL's result codes.
//!
//! Every variant maps to a `strataResult_t` whose numeric value matches `ncclResult_t`
//! (0 success, 1 unhandled cuda, 2 system, 3 internal, 4 invalid argument, 5 invalid
//! usage, 6 remote, 7 in progress). The message is what `strataGetLastError` returns.

#![forbid(unsafe_code)]

use thiserror::Error;

/// Result alias used throughout strata.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in strata.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum Error {
    /// An argument is wrong in itself (NULL buffer, count overflow, bad dtype, rank out of range).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The call is valid alone but not in this state (mismatched counts across ranks,
    /// a topology that does not fit the world, use after destroy, aliasing buffers).
    #[error("invalid usage: {0}")]
    InvalidUsage(String),
    /// A peer died, went away or did not answer within the timeout.
    #[error("remote error: {0}")]
    Remote(String),
    /// The operating system or an external library (MPI, dlopen) failed.
    #[error("system error: {0}")]
    System(String),
    /// A CUDA / HIP runtime call failed.
    #[error("unhandled device error: {0}")]
    Device(String),
    /// The transport or feature exists as a type but was not compiled into this build.
    #[error("not compiled: {0}")]
    NotCompiled(String),
    /// A bug in strata.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// The NCCL-compatible numeric result code of this error.
    pub fn code(&self) -> i32 {
        match self {
            Error::Device(_) => 1,
            Error::System(_) => 2,
            Error::Internal(_) => 3,
            Error::InvalidArgument(_) => 4,
            Error::InvalidUsage(_) | Error::NotCompiled(_) => 5,
            Error::Remote(_) => 6,
        }
    }

    /// The cargo feature a [`Error::NotCompiled`] error names (`mpi`, `cuda` or `rocm`):
    /// what a front (the Python package, a CLI tool) turns into its own next step.
    pub fn missing_feature(&self) -> Option<&'static str> {
        match self {
            Error::NotCompiled(m) => ["mpi", "cuda", "rocm"]
                .into_iter()
                .find(|f| m.contains(&format!("`{f}` feature"))),
            _ => None,
        }
    }

    /// A remote error with `what` failed (the collective, its algorithm and size) in
    /// front of its message; other errors unchanged.
    pub fn in_collective(self, what: impl FnOnce() -> String) -> Error {
        match self {
            Error::Remote(m) => Error::Remote(format!("{} failed: {m}", what())),
            e => e,
        }
    }
}

/// `Err(Error::InvalidArgument(format!(..)))`.
#[macro_export]
macro_rules! invalid_arg {
    ($($t:tt)*) => { Err($crate::error::Error::InvalidArgument(format!($($t)*))) };
}

/// `Err(Error::InvalidUsage(format!(..)))`.
#[macro_export]
macro_rules! invalid_usage {
    ($($t:tt)*) => { Err($crate::error::Error::InvalidUsage(format!($($t)*))) };
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn codes_match_nccl() {
        assert_eq!(Error::InvalidArgument("x".into()).code(), 4);
        assert_eq!(Error::InvalidUsage("x".into()).code(), 5);
        assert_eq!(Error::Remote("x".into()).code(), 6);
        assert_eq!(Error::System("x".into()).code(), 2);
        assert_eq!(Error::Internal("x".into()).code(), 3);
        assert_eq!(Error::Device("x".into()).code(), 1);
    }
}
