//! The HIP device's unit tests (host-side ones run without a GPU).

use super::code::CODE_OBJECTS;
use super::device::{device_memory_type, PointerAttr};
use super::*;
use crate::device::Elementwise;
use crate::dtype::{DataType, ReduceOp};

#[test]
fn device_memory_type_follows_the_runtime_not_the_bindings() {
    // HIP 5.2 (the bindings' own numbering) and ROCm 6.0 / 6.2.
    assert_eq!(device_memory_type(50_221_000), 1);
    assert_eq!(
        device_memory_type(50_221_000),
        sys::hipMemoryType::hipMemoryTypeDevice as i32
    );
    assert_eq!(device_memory_type(60_032_830), 2);
    assert_eq!(device_memory_type(60_241_134), 2);
}

#[test]
fn opening_without_a_device_is_a_clear_error() {
    match HipDevice::open(0) {
        Err(e @ (Error::Device(_) | Error::System(_))) => {
            let m = e.to_string();
            eprintln!("HipDevice::open(0): {m}");
            assert!(m.contains("HIP"), "{m}");
            assert!(m.len() > 40, "{m}");
            // A second attempt behaves the same (nothing half-open is cached).
            let again = HipDevice::open(0).unwrap_err();
            assert_eq!(again.code(), e.code(), "{again}");
        }
        Err(other) => panic!("expected a Device or System error, got {other}"),
        Ok(dev) => smoke(&dev),
    }
    assert!(matches!(
        HipDevice::open(1 << 20),
        Err(Error::Device(_) | Error::System(_))
    ));
}

/// With an AMD GPU: allocation, copies and one launch of each kind agree with the CPU.
fn smoke(dev: &Arc<HipDevice>) {
    let d: Arc<dyn Device> = dev.clone();
    let again = HipDevice::open(dev.ordinal()).unwrap();
    assert!(Arc::ptr_eq(dev, &again), "one HipDevice per ordinal");
    assert!(d.pci_bus_id().unwrap().contains(':'));
    let n = 1000usize;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| 2.0 * i as f32).collect();
    let pa = d.alloc_zeroed(n * 4).unwrap();
    let pb = d.alloc_zeroed(n * 4).unwrap();
    let mut zero = vec![1u8; n * 4];
    d.dtoh(&mut zero, pa).unwrap();
    assert!(zero.iter().all(|&x| x == 0));
    d.htod(pa, bytemuck::cast_slice(&a)).unwrap();
    d.htod(pb, bytemuck::cast_slice(&b)).unwrap();
    d.check_pointer(pa, n * 4).unwrap();
    // The last byte far outside any allocation; null.
    assert!(d.check_pointer(pa, 1 << 44).is_err());
    assert!(d.check_pointer(0, 4).is_err());
    let host = [0u8; 16];
    assert!(d.check_pointer(host.as_ptr() as u64, 16).is_err());
    let s = d.new_stream().unwrap();
    let dtype = DataType::F32;
    let (acc, src, count, op) = (pa, pb, n, ReduceOp::Sum);
    s.elementwise(Elementwise::Reduce {
        acc,
        src,
        count,
        dtype,
        op,
    })
    .unwrap();
    s.elementwise(Elementwise::Divide {
        buf: pa,
        count,
        dtype,
        n: 3,
    })
    .unwrap();
    // SAFETY: null is the legacy default stream.
    unsafe { s.wait_foreign(std::ptr::null_mut()) }.unwrap();
    crate::device::finish(&*s, std::time::Duration::from_secs(30), "smoke", || Ok(())).unwrap();
    let mut out = vec![0u8; n * 4];
    d.dtoh(&mut out, pa).unwrap();
    for (i, c) in out.chunks_exact(4).enumerate() {
        let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        assert_eq!(v, ((3 * i) as f64 / 3.0) as f32, "element {i}");
    }
    // SAFETY: allocated above, freed once, the stream is finished.
    unsafe {
        d.free(pa);
        d.free(pb);
    }
    let links = gcd_links(device_count().unwrap()).unwrap();
    assert_eq!(links.len(), device_count().unwrap());
}

#[test]
fn code_objects_are_elf_with_every_kernel() {
    let names: Vec<String> = crate::kernels_gpu::kernel_names()
        .into_iter()
        .chain(crate::kernels_gpu::reduce_kernel_names())
        .collect();
    assert_eq!(names.len(), 70);
    let skipped: Vec<&str> = env!("STRATA_HIP_SKIPPED")
        .split(',')
        .filter(|s| !s.is_empty())
        .collect();
    for (arch, co) in CODE_OBJECTS.iter() {
        let b = &co.0;
        if skipped.contains(arch) {
            assert!(b.is_empty(), "{arch}: skipped but {} bytes", b.len());
            continue;
        }
        assert!(b.len() > 1024, "{arch}: {} bytes", b.len());
        assert_eq!(&b[..4], b"\x7fELF", "{arch}: not an ELF file");
        assert_eq!(b[4], 2, "{arch}: not ELF64");
        // e_machine (offset 18, little endian) is EM_AMDGPU = 0xe0.
        assert_eq!(
            u16::from_le_bytes([b[18], b[19]]),
            0xe0,
            "{arch}: not AMDGPU"
        );
        assert_eq!(b.as_ptr() as usize % 4096, 0, "{arch}: image not aligned");
        for n in &names {
            let sym = format!("{n}\0");
            assert!(
                b.windows(sym.len()).any(|w| w == sym.as_bytes()),
                "{arch}: kernel {n} missing"
            );
        }
    }
}

#[test]
fn build_script_matches_the_kernel_constants() {
    let skipped: Vec<&str> = env!("STRATA_HIP_SKIPPED")
        .split(',')
        .filter(|s| !s.is_empty())
        .collect();
    // Only the optional gfx942 may be left out (by a hipcc that does not know it).
    assert!(skipped.iter().all(|a| *a == "gfx942"), "{skipped:?}");
    let want: Vec<&str> = crate::kernels_gpu::HIP_ARCHS
        .into_iter()
        .filter(|a| !skipped.contains(a))
        .collect();
    assert_eq!(built_arches(), want);
    assert_eq!(
        env!("STRATA_HIP_ARCHS"),
        crate::kernels_gpu::HIP_ARCHS.join(",")
    );
    let opts: Vec<&str> = env!("STRATA_HIPCC_OPTIONS").split(' ').collect();
    for o in crate::kernels_gpu::HIPCC_OPTIONS {
        assert!(opts.contains(&o), "build.rs does not pass {o}: {opts:?}");
    }
    assert!(env!("STRATA_HIPCC").ends_with("hipcc"));
}

#[test]
fn code_object_is_picked_by_target() {
    assert_eq!(
        code_object_for("gfx90a:sramecc+:xnack-").unwrap().0,
        "gfx90a"
    );
    assert_eq!(code_object_for("gfx940").unwrap().0, "gfx940");
    match code_object_for("gfx942:sramecc+:xnack-") {
        Ok((a, _)) => assert_eq!(a, "gfx942"),
        Err(e) => {
            // Built by a hipcc that does not know gfx942 (Debian's 5.2).
            assert!(env!("STRATA_HIP_SKIPPED").contains("gfx942"), "{e}");
            assert!(matches!(e, Error::Device(_)), "{e}");
            assert!(e.to_string().contains("newer ROCm"), "{e}");
        }
    }
    let e = code_object_for("gfx1100").unwrap_err();
    assert!(matches!(e, Error::Device(_)), "{e}");
    let m = e.to_string();
    assert!(m.contains("gfx1100") && m.contains("gfx90a, gfx940"), "{m}");
    assert!(code_object_for("").is_err());
}

#[test]
fn errors_name_the_call_and_the_runtime_message() {
    let e = check(sys::hipError_t::hipErrorOutOfMemory, || {
        "hipMalloc of 8 bytes".into()
    })
    .unwrap_err();
    assert!(matches!(e, Error::Device(_)), "{e}");
    let m = e.to_string();
    assert!(m.contains("hipMalloc of 8 bytes: "), "{m}");
    assert!(m.contains("hipErrorOutOfMemory"), "{m}");
    assert!(check(sys::hipError_t::hipSuccess, || unreachable!()).is_ok());
}

#[test]
fn abi_layouts_match_the_bindings() {
    use std::mem::{align_of, size_of};
    assert_eq!(
        size_of::<PointerAttr>(),
        size_of::<sys::hipPointerAttribute_t>()
    );
    assert_eq!(
        align_of::<PointerAttr>(),
        align_of::<sys::hipPointerAttribute_t>()
    );
    assert_eq!(
        std::mem::offset_of!(PointerAttr, device),
        std::mem::offset_of!(sys::hipPointerAttribute_t, device)
    );
    assert_eq!(
        std::mem::offset_of!(PointerAttr, device_pointer),
        std::mem::offset_of!(sys::hipPointerAttribute_t, devicePointer)
    );
    // HIP 5.2's hipDeviceProp_t (Debian's /usr/include/hip): 792 bytes, gcnArchName at 396.
    assert_eq!(size_of::<sys::hipDeviceProp_t>(), 792);
    assert_eq!(std::mem::offset_of!(sys::hipDeviceProp_t, gcnArchName), 396);
}

#[test]
fn link_matrix_needs_the_devices() {
    assert!(gcd_links(0).unwrap().is_empty());
    if device_count().unwrap_or(0) == 0 {
        let e = gcd_links(1).unwrap_err();
        assert!(matches!(e, Error::Device(_) | Error::System(_)), "{e}");
    }
}
