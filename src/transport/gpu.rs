//! GPU transports (`nccl`, `rccl`, `cuda-local`). They exist as types in every build so
//! callers can name them; until their issue lands (and in builds without the `cuda` /
//! `rocm` features) constructing one returns [`Error::NotCompiled`].

use crate::error::{Error, Result};

/// NCCL through cudarc (feature `cuda`).
pub struct NcclTransport(());
/// RCCL through dlopen + hip-sys (feature `rocm`).
pub struct RcclTransport(());
/// N ranks as streams on one GPU (feature `cuda`).
pub struct CudaLocalTransport(());

fn not_compiled(name: &str, feature: &str) -> Error {
    Error::NotCompiled(format!(
        "the {name} transport needs the `{feature}` feature and is not implemented in this build"
    ))
}

impl NcclTransport {
    /// Always `Error::NotCompiled` in this build.
    pub fn new() -> Result<NcclTransport> {
        Err(not_compiled("nccl", "cuda"))
    }
}

impl RcclTransport {
    /// Always `Error::NotCompiled` in this build.
    pub fn new() -> Result<RcclTransport> {
        Err(not_compiled("rccl", "rocm"))
    }
}

impl CudaLocalTransport {
    /// Always `Error::NotCompiled` in this build.
    pub fn new() -> Result<CudaLocalTransport> {
        Err(not_compiled("cuda-local", "cuda"))
    }
}
