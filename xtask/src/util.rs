//! Small helpers shared by the tasks: the workspace root, running commands, building.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map_or(manifest.clone(), Path::to_path_buf)
}

/// Run a command in the workspace root, streaming its output; fail with its name on error.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status =
        cmd.current_dir(workspace_root()).status().with_context(|| format!("cannot start {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("{} failed ({status})", describe(cmd));
    }
    Ok(())
}

/// Run a command and capture stdout (stderr passes through).
pub fn output(cmd: &mut Command) -> Result<String> {
    output_in(&workspace_root(), cmd)
}

/// [`output`] with `dir` as the working directory.
pub fn output_in(dir: &Path, cmd: &mut Command) -> Result<String> {
    let out = cmd
        .current_dir(dir)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot start {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!("{} failed ({})", describe(cmd), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Does this command run and exit 0 (output discarded)?
pub fn succeeds(program: &str, args: &[&str]) -> bool {
    Command::new(program).args(args).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

pub fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The directory cargo builds into.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace_root().join("target"), PathBuf::from)
}

/// Build the gpreempt binary and the test helpers (debug profile); returns `target/debug`.
/// The debug build of gpreempt and the test programs. The VM tests inject faults into the
/// controller's session (`GPREEMPT_TEST_FAULT`), so this build enables gpreempt's
/// `fault-injection` feature; `cargo build` and release builds never have it.
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
/// which enables the debug interface, and `hip-streams-6`: `tests/rocm/hip_streams.hip` built by
/// bookworm's hipcc to run on trixie's HIP 5.7 over it; without them (`cargo xtask setup`) the
/// tests that run them fail and say so.
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
    build_hip_client(debug, "hip-streams-6", &crate::rocm6::loader_args())
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
