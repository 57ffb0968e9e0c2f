//! Compiling the embedded CUDA sources with NVRTC (feature `cuda`), to PTX or a CUBIN,
//! through the compiled-kernel cache.

#![forbid(unsafe_code)]

use super::cache;
#[cfg(feature = "cuda")]
use super::nvrtc;
use crate::error::Result;

/// Compile every kernel of [`CUDA_SOURCE`](super::CUDA_SOURCE) to PTX for `arch` (e.g. `compute_80`) with
/// NVRTC, loaded at run time by strata (`STRATA_NVRTC_LIB`, else `libnvrtc.so.13`,
/// `.so.12`, `.so.11.2`, `libnvrtc.so` on the loader path; e.g. the
/// `nvidia/cuda_nvrtc/lib` of the PyPI wheel on `LD_LIBRARY_PATH`, as
/// `scripts/gpu-toolchains` prints).
///
/// Errors, never panics: [`Error::NotCompiled`](crate::Error::NotCompiled) without feature `cuda`;
/// [`Error::System`](crate::Error::System) naming the library candidates tried when libnvrtc is missing, or the
/// include directories tried when `cuda_fp16.h` is missing, or NVRTC's log when the
/// compilation fails.
pub fn compile_cuda_ptx(arch: &str) -> Result<String> {
    compile_cuda_ptx_in(arch, cache::default_dir().as_deref())
}

/// [`compile_cuda_ptx`] with the compiled-kernel cache in `cache_dir` (`None`: no cache;
/// [`cache`]).
pub fn compile_cuda_ptx_in(arch: &str, cache_dir: Option<&std::path::Path>) -> Result<String> {
    check_arch(
        arch,
        "compute_",
        "PTX is compiled for a virtual architecture such as compute_80",
    )?;
    #[cfg(feature = "cuda")]
    {
        match nvrtc::compile(arch, cache_dir)? {
            nvrtc::Output::Ptx(p) => Ok(p),
            nvrtc::Output::Cubin(_) => Err(unexpected("a CUBIN for a PTX")),
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = cache_dir;
        Err(not_compiled())
    }
}

/// `InvalidArgument` unless `arch` starts with `prefix` (`what`: the kind of arch wanted).
fn check_arch(arch: &str, prefix: &str, what: &str) -> Result<()> {
    if arch.starts_with(prefix) {
        return Ok(());
    }
    Err(crate::error::Error::InvalidArgument(format!(
        "{what}, got {arch:?}"
    )))
}

/// NVRTC answered another kind of output than the one asked for.
#[cfg(feature = "cuda")]
fn unexpected(what: &str) -> crate::error::Error {
    crate::error::Error::Internal(format!("NVRTC returned {what} request"))
}

/// What every compile answers without feature `cuda`.
#[cfg(not(feature = "cuda"))]
fn not_compiled() -> crate::error::Error {
    crate::error::Error::NotCompiled(
        "compiling the CUDA kernels needs the `cuda` feature (cudarc + NVRTC)".into(),
    )
}

/// Compile every kernel of [`CUDA_SOURCE`](super::CUDA_SOURCE) to a CUBIN for the real architecture `arch`
/// (e.g. `sm_90`): what the CUDA device loads first, so a driver older than the NVRTC
/// (which would reject its PTX version) still runs the kernels, and nothing is
/// JIT-compiled at load. Errors as [`compile_cuda_ptx`], and `System` for an NVRTC
/// without `nvrtcGetCUBIN` (before CUDA 11.1) or one that does not know `arch`.
pub fn compile_cuda_cubin(arch: &str) -> Result<Vec<u8>> {
    compile_cuda_cubin_in(arch, cache::default_dir().as_deref())
}

/// [`compile_cuda_cubin`] with the compiled-kernel cache in `cache_dir` (`None`: no
/// cache; [`cache`]).
pub fn compile_cuda_cubin_in(arch: &str, cache_dir: Option<&std::path::Path>) -> Result<Vec<u8>> {
    check_arch(
        arch,
        "sm_",
        "a CUBIN is compiled for a real architecture such as sm_90",
    )?;
    #[cfg(feature = "cuda")]
    {
        match nvrtc::compile(arch, cache_dir)? {
            nvrtc::Output::Cubin(c) => Ok(c),
            nvrtc::Output::Ptx(_) => Err(unexpected("PTX for a CUBIN")),
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = cache_dir;
        Err(not_compiled())
    }
}

/// The NVRTC that [`compile_cuda_ptx`] uses: `(library name, major, minor)`. Errors as
/// [`compile_cuda_ptx`] for a missing library or feature.
pub fn nvrtc_version() -> Result<(String, i32, i32)> {
    #[cfg(feature = "cuda")]
    {
        nvrtc::nvrtc_version()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(crate::error::Error::NotCompiled(
            "NVRTC needs the `cuda` feature".into(),
        ))
    }
}

#[cfg(all(test, not(feature = "cuda")))]
mod tests {
    use super::*;

    #[test]
    fn compile_without_feature_is_not_compiled() {
        assert!(matches!(
            compile_cuda_ptx("compute_80"),
            Err(crate::error::Error::NotCompiled(_))
        ));
    }
}
