//! Compiling the embedded CUDA sources with NVRTC (feature `cuda`), to PTX or a CUBIN,
//! through the compiled-kernel cache.

#![forbid(unsafe_code)]

use super::cache;
#[cfg(feature = "cuda")]
use super::nvrtc;
use crate::error::{Error, Result};

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
    let virt = "PTX is compiled for a virtual architecture such as compute_80";
    match compile(arch, cache_dir, "compute_", virt)? {
        Compiled::Ptx(p) => Ok(p),
        Compiled::Cubin(_) => Err(unexpected("a CUBIN for a PTX")),
    }
}

/// What NVRTC produced.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
enum Compiled {
    Ptx(String),
    Cubin(Vec<u8>),
}

/// Compile for `arch` after checking that it starts with `prefix` (`InvalidArgument`
/// saying `what` otherwise); `NotCompiled` without feature `cuda`.
fn compile(
    arch: &str,
    cache_dir: Option<&std::path::Path>,
    prefix: &str,
    what: &str,
) -> Result<Compiled> {
    if !arch.starts_with(prefix) {
        return Err(Error::InvalidArgument(format!("{what}, got {arch:?}")));
    }
    #[cfg(feature = "cuda")]
    {
        Ok(match nvrtc::compile(arch, cache_dir)? {
            nvrtc::Output::Ptx(p) => Compiled::Ptx(p),
            nvrtc::Output::Cubin(c) => Compiled::Cubin(c),
        })
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = cache_dir;
        Err(Error::NotCompiled(
            "compiling the CUDA kernels needs the `cuda` feature (cargo build --features cuda)"
                .into(),
        ))
    }
}

/// NVRTC answered another kind of output than the one asked for.
fn unexpected(what: &str) -> Error {
    Error::Internal(format!("NVRTC returned {what} request"))
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
    let real = "a CUBIN is compiled for a real architecture such as sm_90";
    match compile(arch, cache_dir, "sm_", real)? {
        Compiled::Cubin(c) => Ok(c),
        Compiled::Ptx(_) => Err(unexpected("PTX for a CUBIN")),
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
            "NVRTC needs the `cuda` feature (cargo build --features cuda)".into(),
        ))
    }
}

#[cfg(all(test, not(feature = "cuda")))]
mod tests {
    use super::*;

    #[test]
    fn compile_without_feature_is_not_compiled() {
        // docs/errors.md: the error names the feature and the build.
        for e in [
            compile_cuda_ptx("compute_80").unwrap_err(),
            nvrtc_version().unwrap_err(),
        ] {
            assert_eq!(e.missing_feature(), Some("cuda"), "{e}");
            assert!(e.to_string().contains("cargo build --features cuda"), "{e}");
        }
    }
}
