//! The stand-in ROCm runtime the online clients ring their doorbells through
//! (`tests/rocm/hsa_store_stub.c`, the runtime's `hsa_signal_store_*` exports alone, shaped as
//! ROCr's: API-table thunks and the implementations they jump to), built once
//! per harness run with the system compiler as `libhsa-runtime64.so.1`, the name the scheduler's
//! doorbell probe looks for in a process's maps: the uprobe path measured here is the real one.

use std::{path::PathBuf, process::Command, sync::OnceLock};

/// The library's path, or `None` (said once) when it cannot be built: the clients then ring no
/// doorbell and only the index poll sees them.
pub fn path() -> Option<&'static PathBuf> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT
        .get_or_init(|| match build() {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("harness: the stand-in runtime was not built ({e}); clients ring no doorbell");
                None
            }
        })
        .as_ref()
}

fn build() -> Result<PathBuf, String> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/rocm/hsa_store_stub.c");
    let dir = std::env::temp_dir().join(format!("harness-doorbell-stub-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let lib = dir.join("libhsa-runtime64.so.1");
    let out = Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", "-Wl,-soname,libhsa-runtime64.so.1", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .map_err(|e| format!("cc: {e}"))?;
    if !out.status.success() {
        return Err(format!("cc {}: {}", src.display(), String::from_utf8_lossy(&out.stderr)));
    }
    Ok(lib)
}

/// `hsa_signal_store_screlease(hsa_signal_t, hsa_signal_value_t)` of the stand-in runtime.
pub type Store = unsafe extern "C" fn(u64, i64);

/// Open the stand-in runtime at `lib` (kept open for the process's life) and take its
/// `hsa_signal_store_screlease`; also returns the library handle for a caller that closes it.
pub fn open_store(lib: &std::path::Path) -> anyhow::Result<(Store, *mut libc::c_void)> {
    let c = std::ffi::CString::new(lib.as_os_str().as_encoded_bytes())?;
    // SAFETY: dlopen of the stand-in runtime: two thunks, two stores and a constructor that fills
    // its table.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        anyhow::bail!("dlopen {} failed", lib.display());
    }
    // SAFETY: a symbol of the library just opened.
    let f = unsafe { libc::dlsym(handle, c"hsa_signal_store_screlease".as_ptr()) };
    if f.is_null() {
        anyhow::bail!("{} has no hsa_signal_store_screlease", lib.display());
    }
    // SAFETY: the stub's function has exactly this signature (hsa_signal_t is one u64).
    Ok((unsafe { std::mem::transmute::<*mut libc::c_void, Store>(f) }, handle))
}
