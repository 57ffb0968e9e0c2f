//! strata's kernels as HIP code objects: the ELF images `build.rs` builds with hipcc
//! once per target of [`crate::kernels_gpu::HIP_ARCHS`], embedded, and the choice of
//! one for a device's `gcnArchName`.

#![forbid(unsafe_code)]

use crate::error::{Error, Result};

/// A byte string aligned for the ELF loader (include_bytes! alone gives alignment 1).
#[repr(C, align(4096))]
pub(super) struct Aligned<B: ?Sized>(pub(super) B);

/// The code objects built by `build.rs`, as `(target, ELF image)`, in the order of
/// [`crate::kernels_gpu::HIP_ARCHS`].
pub(super) static CODE_OBJECTS: [(&str, &Aligned<[u8]>); 3] = [
    (
        "gfx90a",
        &Aligned(*include_bytes!(concat!(
            env!("OUT_DIR"),
            "/strata_gfx90a.co"
        ))),
    ),
    (
        "gfx940",
        &Aligned(*include_bytes!(concat!(
            env!("OUT_DIR"),
            "/strata_gfx940.co"
        ))),
    ),
    (
        "gfx942",
        &Aligned(*include_bytes!(concat!(
            env!("OUT_DIR"),
            "/strata_gfx942.co"
        ))),
    ),
];

/// The targets strata's HIP kernels are built for (an optional target the build's hipcc
/// did not know is left out).
pub fn built_arches() -> Vec<&'static str> {
    CODE_OBJECTS
        .iter()
        .filter(|(_, co)| !co.0.is_empty())
        .map(|(a, _)| *a)
        .collect()
}

/// The embedded code object for a device whose `gcnArchName` is `gcn_arch_name`
/// (`gfx90a:sramecc+:xnack-`: the target is the part before the first `:`), or
/// [`Error::Device`] naming the device's target and the targets built.
pub fn code_object_for(gcn_arch_name: &str) -> Result<(&'static str, &'static [u8])> {
    let target = gcn_arch_name.split(':').next().unwrap_or("").trim();
    if let Some((a, _)) = CODE_OBJECTS
        .iter()
        .find(|(a, co)| *a == target && co.0.is_empty())
    {
        return Err(Error::Device(format!(
            "the HIP device is {gcn_arch_name:?}; strata's {a} kernels were not built: the \
             hipcc used at build time ({}) does not know {a} (ROCm 5.7 or later does); \
             rebuild with HIPCC or HIP_PATH pointing at a newer ROCm",
            env!("STRATA_HIPCC")
        )));
    }
    CODE_OBJECTS
        .iter()
        .find(|(a, co)| *a == target && !co.0.is_empty())
        .map(|(a, co)| (*a, &co.0))
        .ok_or_else(|| {
            Error::Device(format!(
                "the HIP device is {gcn_arch_name:?} (target {target:?}); strata's HIP kernels \
                 are built for {} only (HIP_ARCHS in src/kernels_gpu/mod.rs, built by \
                 build.rs)",
                built_arches().join(", ")
            ))
        })
}
