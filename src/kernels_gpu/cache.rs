//! The compiled kernels on disk: NVRTC's output (PTX or a CUBIN) kept per identity, so
//! that only a process's first compilation on a machine pays NVRTC (12-22 s for the
//! quantization kernels on an H200 host, docs/kernels.md); later processes load the file.
//!
//! An entry's identity is everything its bytes depend on: the NVRTC library and version,
//! the architecture, every option (the register geometry and include paths among them)
//! and the source (its length and two 64-bit hashes). The file starts with that identity
//! and is used only when it matches exactly, so a changed source, option or NVRTC never
//! loads stale code; a damaged or foreign file is recompiled over. Files are written to a
//! temporary name and renamed, so concurrent processes never read half a file.
//!
//! Where: `STRATA_KERNEL_CACHE` (a directory, or `off`), else `kernels/` under
//! [`crate::config::cache_dir`].

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

const MAGIC: &str = "strata kernel cache v1\n";

/// The directory compiled kernels are kept in, or `None` when `STRATA_KERNEL_CACHE=off`.
pub fn default_dir() -> Option<PathBuf> {
    match std::env::var_os("STRATA_KERNEL_CACHE") {
        Some(v) if v == "off" => None,
        Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => Some(crate::config::cache_dir().join("kernels")),
    }
}

fn fnv1a(bytes: &[u8], basis: u64) -> u64 {
    bytes.iter().fold(basis, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The identity of a compilation (module doc).
pub fn identity(nvrtc: &str, arch: &str, options: &[String], source: &str) -> String {
    let s = source.as_bytes();
    format!(
        "{MAGIC}nvrtc {nvrtc}\narch {arch}\noptions {}\nsource {} {:016x} {:016x}\n\n",
        options.join(" "),
        s.len(),
        fnv1a(s, 0xcbf2_9ce4_8422_2325),
        fnv1a(s, 0x6c62_272e_07bb_0142),
    )
}

/// The file of `identity` in `dir`.
pub fn file(dir: &Path, arch: &str, identity: &str) -> PathBuf {
    let arch: String = arch
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    dir.join(format!(
        "strata-kernels-{arch}-{:016x}.bin",
        fnv1a(identity.as_bytes(), 0xcbf2_9ce4_8422_2325)
    ))
}

/// The cached bytes of `identity`, if a file holds exactly them.
pub fn load(dir: &Path, arch: &str, identity: &str) -> Option<Vec<u8>> {
    let data = std::fs::read(file(dir, arch, identity)).ok()?;
    let body = data.strip_prefix(identity.as_bytes())?;
    (!body.is_empty()).then(|| body.to_vec())
}

/// Keep `bytes` as `identity`'s entry (atomically: a temporary file renamed).
pub fn store(dir: &Path, arch: &str, identity: &str, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let dst = file(dir, arch, identity);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = dst.with_extension(format!("tmp{}-{nanos}", std::process::id()));
    let mut data = Vec::with_capacity(identity.len() + bytes.len());
    data.extend_from_slice(identity.as_bytes());
    data.extend_from_slice(bytes);
    std::fs::write(&tmp, &data)?;
    std::fs::rename(&tmp, &dst).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("strata-kcache-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn entries_load_only_for_their_exact_identity() {
        let d = dir("exact");
        let opts = vec!["--fmad=false".to_string(), "-DSTRATA_LANE_ELEMS=64".into()];
        let id = identity("libnvrtc.so.12 12.9", "sm_90", &opts, "kernel source");
        assert_eq!(load(&d, "sm_90", &id), None);
        store(&d, "sm_90", &id, b"\x7fELF cubin").unwrap();
        assert_eq!(load(&d, "sm_90", &id).unwrap(), b"\x7fELF cubin");
        // Any change of source, option, NVRTC or arch is another entry.
        for other in [
            identity("libnvrtc.so.12 12.9", "sm_90", &opts, "kernel sourcf"),
            identity("libnvrtc.so.12 12.8", "sm_90", &opts, "kernel source"),
            identity("libnvrtc.so.12 12.9", "sm_80", &opts, "kernel source"),
            identity("libnvrtc.so.12 12.9", "sm_90", &opts[..1], "kernel source"),
        ] {
            assert_ne!(other, id);
            assert_eq!(load(&d, "sm_90", &other), None);
        }
        // A damaged file (a foreign header, a truncated one) is a miss, then replaced.
        let f = file(&d, "sm_90", &id);
        std::fs::write(&f, b"strata kernel cache v1\nnvrtc other").unwrap();
        assert_eq!(load(&d, "sm_90", &id), None);
        std::fs::write(&f, id.as_bytes()).unwrap();
        assert_eq!(load(&d, "sm_90", &id), None);
        store(&d, "sm_90", &id, b"again").unwrap();
        assert_eq!(load(&d, "sm_90", &id).unwrap(), b"again");
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn an_unwritable_directory_is_an_error_not_a_panic() {
        let d = dir("file");
        std::fs::create_dir_all(d.parent().unwrap()).unwrap();
        std::fs::write(&d, b"a file where the directory should be").unwrap();
        let id = identity("n", "sm_90", &[], "s");
        assert!(store(&d, "sm_90", &id, b"x").is_err());
        assert_eq!(load(&d, "sm_90", &id), None);
        let _ = std::fs::remove_file(&d);
    }
}
