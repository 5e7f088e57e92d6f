//! Debian trixie's ROCm 6.1 runtime (ROCr 6.1.2 with libhsakmt 6.2.4) and HIP 5.7 on it,
//! unpacked beside the kernels for the tests, never installed: ROCr ≥ 6 calls RUNTIME_ENABLE at `hsa_init`
//! (libhsa-runtime64 6.1.2 imports `hsaKmtRuntimeEnable`; later ROCr calls it from
//! `KfdDriver::Init`; gpreempt finds a 6.1 process runtime-enabled), which KFD requires before it
//! suspends a process's queues; bookworm's ROCr 5.2 never does. Trixie's
//! libraries need glibc ≥ 2.38 (bookworm has 2.36), so its libc, libstdc++ and the runtime's other
//! dependencies come along and the clients built against it (`hsa-dispatch-6`) name trixie's
//! dynamic loader and library directory (`--dynamic-linker`, `-rpath`): nothing of the host's
//! libraries changes. HIP 5.7 (`libamdhip64.so.5`: the SONAME of bookworm's HIP 5.2, its
//! symbols under the same `hip_4.2` version) runs a program built by bookworm's `hipcc` once it
//! is linked that way (`hip-streams-6`).

use std::{fs, path::PathBuf};

use anyhow::Result;

use crate::kernels::{self, PrivateApt, TRIXIE};

/// The runtime and HIP, pinned: a moved pin is fetched again.
const PINNED: &[&str] = &["libhsa-runtime64-1=6.1.2-3", "libhsakmt1=6.2.4+ds-1", "libamdhip64-5=5.7.1-6+deb13u1"];

/// Their dependencies as trixie has them (`apt-cache depends --recurse`): glibc, the C++ runtime,
/// libdrm, libnuma, libelf and its compressors; for HIP the code object manager (comgr 2), the
/// LLVM 17 it is built on and LLVM's own libraries.
const DEPENDENCIES: &[&str] = &[
    "libc6",
    "libgcc-s1",
    "libstdc++6",
    "libnuma1",
    "libelf1t64",
    "libdrm2",
    "libdrm-amdgpu1",
    "zlib1g",
    "libzstd1",
    "libamd-comgr2",
    "libllvm17t64",
    "libedit2",
    "libffi8",
    "libtinfo6",
    "libxml2",
    "libz3-4",
    "liblzma5",
    "libbsd0",
    "libmd0",
];

const STAMP: &str = ".gpreempt-rocm";

/// `~/.local/share/gpreempt/rocm-6.1`.
pub fn root() -> PathBuf {
    kernels::kernels_dir().with_file_name("rocm-6.1")
}

/// Its library directory (the runtime, its dependencies and trixie's `ld-linux-x86-64.so.2`).
pub fn lib_dir() -> PathBuf {
    root().join("usr/lib/x86_64-linux-gnu")
}

fn stamp() -> String {
    format!("{} {}\n", PINNED.join(" "), DEPENDENCIES.join(" "))
}

pub fn present() -> bool {
    fs::read_to_string(root().join(STAMP)).is_ok_and(|s| s == stamp())
        && lib_dir().join("libhsa-runtime64.so.1").exists()
        && lib_dir().join("libamdhip64.so.5").exists()
}

/// Fetch and unpack the runtime unless it is in place.
pub fn provision() -> Result<()> {
    let apt = PrivateApt::new(&[TRIXIE])?;
    apt.update()?;
    let debs = kernels::kernels_dir().join(".debs").join("rocm-6.1");
    let _ = fs::remove_dir_all(&debs);
    let mut wanted: Vec<String> = PINNED.iter().map(|p| (*p).to_owned()).collect();
    wanted.extend(DEPENDENCIES.iter().map(|p| format!("{p}/{}", TRIXIE.name)));
    apt.download(&wanted, &debs)?;
    let root = root();
    kernels::unpack_debs(&debs, &root)?;
    // libLLVM-17.so.1 carries DT_RUNPATH `$ORIGIN/../lib`, which from usr/lib/x86_64-linux-gnu
    // names usr/lib/lib; a library with a RUNPATH ignores the executable's RPATH for its own
    // dependencies (ld.so(8)), so without this link libffi, libedit, libz3, libtinfo and
    // libxml2 would come from the host.
    std::os::unix::fs::symlink("x86_64-linux-gnu", root.join("usr/lib/lib"))?;
    fs::write(root.join(STAMP), stamp())?;
    Ok(())
}

/// `cc` arguments that link a client against this runtime and make it run with trixie's loader
/// and libraries (bookworm's `hsa.h` declares the same API: ROCr keeps it stable).
pub fn link_args() -> Vec<String> {
    let mut args = vec![format!("-L{}", lib_dir().display()), "-l:libhsa-runtime64.so.1".to_owned()];
    args.extend(loader_args());
    args
}

/// The linker arguments that make a program run with trixie's loader and libraries (alone for
/// `hipcc`, which links `libamdhip64.so.5` itself: bookworm's HIP 5.2 at link time, trixie's
/// HIP 5.7 at run time).
pub fn loader_args() -> Vec<String> {
    let lib = lib_dir();
    let lib = lib.display();
    vec![
        format!("-Wl,--dynamic-linker={lib}/ld-linux-x86-64.so.2"),
        format!("-Wl,-rpath,{lib}"),
        // DT_RPATH, not DT_RUNPATH: it also applies to the runtime's own dependencies
        // (libstdc++, libhsakmt), which must come from trixie too.
        "-Wl,--disable-new-dtags".to_owned(),
        // The runtime's own dependencies resolve inside the directory at run time, not at link time.
        "-Wl,--allow-shlib-undefined".to_owned(),
    ]
}
