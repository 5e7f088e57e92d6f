//! The binaries the tasks build and run: gpreempt and the test programs for the VM tests (the
//! `gpreempt-tests` binaries, the doorbell stub, the ROCm and HIP clients of `tests/rocm/`), and
//! `cargo xtask run`. Apart from `util` (generic helpers only) so that `util` needs no task: the
//! ROCm 6.1 clients need `rocm6`, which needs `kernels`, which needs `util`.

use std::{path::PathBuf, process::Command};

use anyhow::{Context, Result};

use crate::util::{cargo, is_root, run, target_dir, workspace_root};

/// The debug build of gpreempt and the test programs; returns `target/debug`. The VM tests
/// inject faults into the controller's session (`GPREEMPT_TEST_FAULT`), so this build enables
/// gpreempt's `fault-injection` feature; `cargo build` and release builds never have it.
pub fn build_binaries() -> Result<PathBuf> {
    run(cargo().args([
        "build",
        "--package",
        "gpreempt",
        "--package",
        "gpreempt-tests",
        "--bins",
        "--features",
        "gpreempt/fault-injection",
    ]))?;
    let debug = target_dir().join("debug");
    build_doorbell_stub(&debug)?;
    build_rocm_clients(&debug)?;
    build_rocm6_client(&debug)?;
    Ok(debug)
}

/// `doorbell-stub/libhsa-runtime64.so.1`: `tests/rocm/hsa_store_stub.c`, the runtime's doorbell
/// exports alone, for the doorbell probe's tests (the system compiler only).
pub fn build_doorbell_stub(debug: &std::path::Path) -> Result<PathBuf> {
    let dir = debug.join("doorbell-stub");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let (src, lib) = (workspace_root().join("tests/rocm/hsa_store_stub.c"), dir.join("libhsa-runtime64.so.1"));
    run(Command::new("cc")
        .args(["-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-Wl,-soname,libhsa-runtime64.so.1", "-o"])
        .arg(&lib)
        .arg(&src))
    .with_context(|| format!("building {}", src.display()))?;
    Ok(lib)
}

/// `hsa-dispatch-6`: `tests/rocm/hsa_dispatch.c` against trixie's ROCm 6.1 runtime (`rocm6.rs`),
/// which enables the debug interface, `hip-streams-6`: `tests/rocm/hip_streams.hip` built by
/// bookworm's hipcc to run on trixie's HIP 5.7 over it, and `hip-streams-gfx942`: the same
/// program built by trixie's clang 17 against HIP 5.7 with a gfx942 code object; without them
/// (`cargo xtask setup`) the tests that run them fail and say so.
fn build_rocm6_client(debug: &std::path::Path) -> Result<()> {
    if !crate::rocm6::present() || !std::path::Path::new("/usr/include/hsa/hsa.h").exists() {
        eprintln!("xtask: the ROCm 6.1 runtime is not unpacked (cargo xtask setup): not building hsa-dispatch-6");
        return Ok(());
    }
    let src = workspace_root().join("tests/rocm/hsa_dispatch.c");
    run(Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(debug.join("hsa-dispatch-6"))
        .arg(&src)
        .args(crate::rocm6::link_args()))
    .with_context(|| format!("building {} against ROCm 6.1", src.display()))?;
    build_hip_client(debug, "hip-streams-6", &crate::rocm6::loader_args())?;
    let src = workspace_root().join("tests/rocm/hip_streams.hip");
    run(Command::new(crate::rocm6::clang())
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(debug.join("hip-streams-gfx942"))
        .args(crate::rocm6::hip_args("gfx942"))
        .arg(&src))
    .with_context(|| format!("building hip-streams-gfx942 from {} with trixie's clang 17", src.display()))
}

/// The C clients of Debian's ROCm runtime (`tests/rocm/`), built with the system compiler
/// against `libhsa-runtime-dev` when it is installed (`cargo xtask setup`), and the gfx90a code
/// object `hsa-dispatch` loads, built by Debian's clang-15 and lld-15 into
/// `hsa-dispatch-kernel.hsaco` beside it; without them the tests that run them fail and say so.
fn build_rocm_clients(debug: &std::path::Path) -> Result<()> {
    if !std::path::Path::new("/usr/include/hsa/hsa.h").exists() {
        eprintln!("xtask: libhsa-runtime-dev is not installed (cargo xtask setup): not building tests/rocm/");
        return Ok(());
    }
    let rocm = workspace_root().join("tests/rocm");
    for (source, binary) in [("hsa_queues.c", "hsa-queues"), ("hsa_dispatch.c", "hsa-dispatch")] {
        let src = rocm.join(source);
        run(Command::new("cc")
            .args(["-O1", "-Wall", "-Werror", "-o"])
            .arg(debug.join(binary))
            .arg(&src)
            .arg("-lhsa-runtime64"))
        .with_context(|| format!("building {}", src.display()))?;
    }
    if !std::path::Path::new("/usr/bin/clang-15").exists() || !std::path::Path::new("/usr/bin/ld.lld-15").exists() {
        eprintln!("xtask: clang-15 or lld-15 is not installed (cargo xtask setup): no gfx90a code object");
        return Ok(());
    }
    // An OpenCL kernel for gfx90a without device libraries (it uses compiler builtins only),
    // linked into a code object (v4, clang-15's default) as hipcc links its device code.
    let src = rocm.join("hsa_dispatch_kernel.cl");
    let object = debug.join("hsa-dispatch-kernel.o");
    run(Command::new("clang-15")
        .args(["-x", "cl", "-cl-std=CL2.0", "-target", "amdgcn-amd-amdhsa", "-mcpu=gfx90a", "-nogpulib", "-O2"])
        .args(["-Wall", "-Werror", "-c", "-o"])
        .arg(&object)
        .arg(&src))
    .with_context(|| format!("building {}", src.display()))?;
    run(Command::new("ld.lld-15").arg("-shared").arg("-o").arg(debug.join("hsa-dispatch-kernel.hsaco")).arg(&object))
        .context("linking hsa-dispatch-kernel.hsaco")?;
    build_hip_client(debug, "hip-streams", &[])
}

/// The HIP program (`tests/rocm/hip_streams.hip`), built for gfx90a by Debian's hipcc 5.2 as
/// `binary` (with `link_args`: `hip-streams-6` runs on trixie's HIP 5.7) when hipcc and
/// libamdhip64-dev are installed (`cargo xtask setup`); without them the tests that run it fail
/// and say so.
fn build_hip_client(debug: &std::path::Path, binary: &str, link_args: &[String]) -> Result<()> {
    if !std::path::Path::new("/usr/bin/hipcc").exists()
        || !std::path::Path::new("/usr/include/hip/hip_runtime.h").exists()
    {
        eprintln!("xtask: hipcc or libamdhip64-dev is not installed (cargo xtask setup): not building {binary}");
        return Ok(());
    }
    let src = workspace_root().join("tests/rocm/hip_streams.hip");
    run(Command::new("hipcc")
        .args(["--offload-arch=gfx90a", "-O1", "-Wall", "-Werror", "-o"])
        .arg(debug.join(binary))
        .arg(&src)
        .args(link_args))
    .with_context(|| format!("building {binary} from {}", src.display()))
}

/// `cargo xtask run -- ARGS`: build, then run gpreempt as root.
pub fn run_gpreempt(release: bool, args: &[String]) -> Result<()> {
    let mut build = cargo();
    build.args(["build", "--package", "gpreempt"]);
    if release {
        build.arg("--release");
    }
    run(&mut build)?;
    let binary = target_dir().join(if release { "release" } else { "debug" }).join("gpreempt");
    let mut cmd = if is_root() {
        Command::new(&binary)
    } else {
        let mut sudo = Command::new("sudo");
        sudo.arg("-E").arg(&binary);
        sudo
    };
    let status = cmd.args(args).status().with_context(|| format!("cannot start {}", binary.display()))?;
    std::process::exit(status.code().unwrap_or(1));
}
