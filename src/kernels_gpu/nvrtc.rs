//! NVRTC through cudarc, loaded at run time. cudarc panics when the library is missing,
//! so the library is probed first (by cudarc's own candidate list) and the compile runs
//! under `catch_unwind`: every failure is an `Error`, never a panic.

use super::{cuda_include_dirs, CUDA_SOURCE, NVRTC_OPTIONS};
use crate::error::{Error, Result};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};

/// The shared-library names cudarc tries for NVRTC.
pub(crate) fn nvrtc_candidates() -> Vec<String> {
    cudarc::get_lib_name_candidates("nvrtc")
}

/// `Ok` when cudarc can load libnvrtc; `System` naming the candidates tried otherwise.
pub(crate) fn probe_nvrtc() -> Result<()> {
    // SAFETY: `is_culib_present` only dlopens the candidate names (running their
    // initializers, as any use of the library would) and drops the handles.
    let present = std::panic::catch_unwind(|| unsafe { cudarc::nvrtc::sys::is_culib_present() })
        .unwrap_or(false);
    if present {
        Ok(())
    } else {
        Err(Error::System(format!(
            "libnvrtc not found: tried {:?} on the loader path; install the PyPI wheel \
             nvidia-cuda-nvrtc-cu12 (scripts/gpu-toolchains) and put its nvidia/cuda_nvrtc/lib \
             on LD_LIBRARY_PATH",
            nvrtc_candidates()
        )))
    }
}

pub(crate) fn compile(arch: &str) -> Result<String> {
    // PTX only (cudarc reads nvrtcGetPTX): a virtual architecture, compute_XY.
    let digits = arch.strip_prefix("compute_").unwrap_or("");
    if digits.len() < 2 || !digits.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(Error::InvalidArgument(format!(
            "NVRTC arch must be a virtual architecture such as compute_80, got {arch:?}"
        )));
    }
    probe_nvrtc()?;
    let (found, tried) = cuda_include_dirs();
    if found.is_empty() {
        return Err(Error::System(format!(
            "cuda_fp16.h not found: tried {tried:?}; set STRATA_CUDA_INCLUDE to the \
             include directory of nvidia-cuda-runtime-cu12 (scripts/gpu-toolchains prints it)"
        )));
    }
    let mut options: Vec<String> = NVRTC_OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(format!("--gpu-architecture={arch}"));
    let opts = CompileOptions {
        include_paths: found.iter().map(|d| d.display().to_string()).collect(),
        options,
        name: Some("strata_quant.cu".into()),
        ..Default::default()
    };
    let res = std::panic::catch_unwind(|| compile_ptx_with_opts(CUDA_SOURCE, opts));
    match res {
        Ok(Ok(ptx)) => Ok(ptx.to_src()),
        Ok(Err(CompileError::CompileError { log, .. })) => Err(Error::System(format!(
            "NVRTC failed to compile the strata kernels for {arch}:\n{}",
            log.to_string_lossy()
        ))),
        Ok(Err(e)) => Err(Error::System(format!("NVRTC error for {arch}: {e:?}"))),
        Err(p) => Err(Error::System(format!(
            "NVRTC panicked (a missing symbol in libnvrtc?): {}",
            panic_text(&p)
        ))),
    }
}

pub(crate) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".into()
    }
}
