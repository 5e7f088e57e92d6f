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
//!
//! Trixie's LLVM 17 comes along too, the compiler trixie's `hipcc` 5.7 runs: it builds the same
//! program with a gfx942 (MI300X) code object (`hip-streams-gfx942`) against HIP 5.7's own headers
//! and ROCm's device libraries for LLVM 17. Bookworm's clang-15 cannot: it rejects `gfx942`
//! ("invalid target ID 'gfx942'"; its newest GFX9.4 target is gfx940, which ROCr does not load on a
//! gfx942 agent).

use std::{fs, path::PathBuf, process::Command};

use anyhow::{Context, Result};

use crate::{
    kernels::{self, PrivateApt, TRIXIE},
    util::{self, output},
};

/// The runtime and HIP (with HIP's headers, for the gfx942 build), pinned: a moved pin is fetched
/// again.
const PINNED: &[&str] = &[
    "libhsa-runtime64-1=6.1.2-3",
    "libhsakmt1=6.2.4+ds-1",
    "libamdhip64-5=5.7.1-6+deb13u1",
    "libamdhip64-dev=5.7.1-6+deb13u1",
];

/// Trixie's LLVM 17 as its `hipcc` 5.7 uses it (`apt-cache depends hipcc`), less what a HIP
/// program's build does not run: the driver with the HIP front end and the AMDGPU back end
/// (`clang-17`, `libclang-cpp17t64`), the resource headers with HIP's wrapper headers
/// (`libclang-common-17-dev`), the device-code linker (`lld-17`), `clang-offload-bundler`
/// (`clang-tools-17`), which makes the fat binary HIP's runtime reads, and ROCm's device
/// libraries built for LLVM 17 (`rocm-device-libs-17`: HIP 5.7's headers read the work-item ids
/// through ockl). Taken as trixie has them, with `libllvm17t64` above: one version of LLVM.
const TOOLCHAIN: &[&str] =
    &["clang-17", "libclang-cpp17t64", "libclang-common-17-dev", "lld-17", "clang-tools-17", "rocm-device-libs-17"];

/// The toolchain's executables that a HIP build runs, relative to the root. The clang driver runs
/// its front end again as itself (`/proc/self/exe`) and lld and the bundler from its own
/// directory, so a wrapper script that runs them through trixie's loader (as `kernels.rs` does for
/// kbuild tools) would leave the driver executing the loader: instead their ELF interpreter and
/// library path name trixie's (`patchelf`), and they run as they are.
const TOOLS: &[&str] =
    &["usr/lib/llvm-17/bin/clang", "usr/lib/llvm-17/bin/lld", "usr/lib/llvm-17/bin/clang-offload-bundler"];

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
    format!("{} {} {}\n", PINNED.join(" "), DEPENDENCIES.join(" "), TOOLCHAIN.join(" "))
}

pub fn present() -> bool {
    fs::read_to_string(root().join(STAMP)).is_ok_and(|s| s == stamp())
        && lib_dir().join("libhsa-runtime64.so.1").exists()
        && lib_dir().join("libamdhip64.so.5").exists()
        && clang().exists()
}

/// Trixie's `clang++` 17 (a link to `clang`).
pub fn clang() -> PathBuf {
    root().join("usr/lib/llvm-17/bin/clang++")
}

/// Fetch and unpack the runtime unless it is in place.
pub fn provision() -> Result<()> {
    let apt = PrivateApt::new(&[TRIXIE])?;
    apt.update()?;
    let debs = kernels::kernels_dir().join(".debs").join("rocm-6.1");
    let _ = fs::remove_dir_all(&debs);
    let mut wanted: Vec<String> = PINNED.iter().map(|p| (*p).to_owned()).collect();
    wanted.extend(DEPENDENCIES.iter().chain(TOOLCHAIN).map(|p| format!("{p}/{}", TRIXIE.name)));
    apt.download(&wanted, &debs)?;
    let root = root();
    kernels::unpack_debs(&debs, &root)?;
    // libLLVM-17.so.1 carries DT_RUNPATH `$ORIGIN/../lib`, which from usr/lib/x86_64-linux-gnu
    // names usr/lib/lib; a library with a RUNPATH ignores the executable's RPATH for its own
    // dependencies (ld.so(8)), so without this link libffi, libedit, libz3, libtinfo and
    // libxml2 would come from the host.
    std::os::unix::fs::symlink("x86_64-linux-gnu", root.join("usr/lib/lib"))?;
    let (loader, lib) = (lib_dir().join("ld-linux-x86-64.so.2"), lib_dir());
    for tool in TOOLS {
        // DT_RPATH (`--force-rpath`), as for the clients below: it also applies to the tools'
        // libraries (libclang-cpp, libLLVM), which must find trixie's libc and libstdc++.
        util::run(
            Command::new("patchelf")
                .arg("--set-interpreter")
                .arg(&loader)
                .arg("--force-rpath")
                .arg("--set-rpath")
                .arg(&lib)
                .arg(root.join(tool)),
        )
        .with_context(|| format!("patchelf {tool} (cargo xtask setup installs patchelf)"))?;
    }
    // The tools must run on this host; one call proves it.
    output(Command::new(clang()).arg("--version")).context("trixie's clang 17 does not run on this host")?;
    fs::write(root.join(STAMP), stamp())?;
    Ok(())
}

/// `clang++` arguments that build a HIP source for `arch` against HIP 5.7 as trixie's `hipcc` 5.7
/// would (`-x hip --offload-arch`), linked to run on trixie's HIP 5.7 and loader. The driver finds
/// the device libraries in its resource directory (Debian's layout). `--hip-path` alone would
/// put HIP 5.7's headers after the system's (`-idirafter`), where bookworm's HIP 5.2 headers
/// (`libamdhip64-dev`, for `hip-streams`) come first: `-isystem` puts 5.7's ahead.
pub fn hip_args(arch: &str) -> Vec<String> {
    let usr = root().join("usr");
    let mut args = vec![
        "-x".to_owned(),
        "hip".to_owned(),
        format!("--offload-arch={arch}"),
        format!("--hip-path={}", usr.display()),
        format!("-isystem{}", usr.join("include").display()),
    ];
    args.extend(["-L".to_owned(), lib_dir().display().to_string(), "-l:libamdhip64.so.5".to_owned()]);
    args.extend(loader_args());
    args
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
