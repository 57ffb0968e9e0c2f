//! The engine's error type: strata's communication errors, bad strategies, model and
//! I/O failures. Every message says what was wrong and what would be accepted.

/// What went wrong in the engine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A collective or communicator call failed.
    #[error("communication: {0}")]
    Comm(#[from] strata::Error),
    /// A strategy, preset or factor that cannot run (the message explains the rule).
    #[error("strategy: {0}")]
    Config(String),
    /// The model's compute failed (shapes, candle errors).
    #[error("model: {0}")]
    Model(String),
    /// Files (JSON output, corpus).
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

impl From<candle_core::Error> for Error {
    fn from(e: candle_core::Error) -> Error {
        Error::Model(e.to_string())
    }
}

/// `Result` with the engine's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// `Err(Error::Config(format!(...)))`.
macro_rules! config_err {
    ($($t:tt)*) => { Err($crate::error::Error::Config(format!($($t)*))) };
}
pub(crate) use config_err;
