//! `cargo xtask setup`: install what a fresh machine of this kind lacks, idempotently.
//! One line per step; a step that finds its tool present does nothing (a second run takes
//! seconds). Facts behind each step: docs/toolchain.md.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

use crate::util::{self, output, succeeds};

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
];

/// The 6.12 kernel of the VM matrix (debug-trap API, KFD 1.17).
pub const KERNEL_612_PACKAGE: &str = "linux-image-6.12.117+deb12-amd64-unsigned";
pub const KERNEL_612_RELEASE: &str = "6.12.117+deb12-amd64";

fn step(name: &str, state: &str) {
    println!("setup: {name:<44} {state}");
}

pub fn run() -> Result<()> {
    nightly()?;
    rust_src()?;
    stable_components()?;
    bpf_linker()?;
    apt_packages()?;
    kernels()?;
    kernel_headers()?;
    virtme_ng()?;
    Ok(())
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

/// Newest installed kernel release whose name starts with `prefix` (e.g. `6.1.0-`).
pub fn installed_kernel(prefix: &str) -> Option<String> {
    let mut releases: Vec<String> = fs::read_dir("/boot")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("vmlinuz-").map(str::to_owned))
        .filter(|r| r.starts_with(prefix) && Path::new("/lib/modules").join(r).join("modules.dep").exists())
        .collect();
    releases.sort_by_key(|r| version_key(r));
    releases.pop()
}

/// `6.1.0-56-amd64` → [6, 1, 0, 56] for ordering.
fn version_key(release: &str) -> Vec<u64> {
    release.split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse().ok()).collect()
}

fn kernels() -> Result<()> {
    let mut wanted = Vec::new();
    if let Some(release) = installed_kernel("6.1.0-") {
        step(&format!("kernel {release}"), "present");
    } else {
        // The newest 6.1 ABI Debian offers.
        util::run(Command::new("apt-get").args(["update", "-q"]))?;
        let list =
            output(Command::new("apt-cache").args(["search", "--names-only", r"^linux-image-6\.1\.0-[0-9]+-amd64$"]))?;
        let newest = list
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .max_by_key(|p| version_key(p))
            .context("apt-cache finds no linux-image-6.1.0-*-amd64 package")?
            .to_owned();
        wanted.push(newest);
    }
    if installed_kernel(KERNEL_612_RELEASE).is_some() {
        step(&format!("kernel {KERNEL_612_RELEASE}"), "present");
    } else {
        wanted.push(KERNEL_612_PACKAGE.to_owned());
    }
    if wanted.is_empty() {
        return Ok(());
    }
    step(&wanted.join(" "), "installing");
    apt_install(&wanted)
}

/// `linux-headers-<release>` of each VM kernel: the KFD emulator module is built against them.
fn kernel_headers() -> Result<()> {
    let releases = [installed_kernel("6.1.0-"), installed_kernel(KERNEL_612_RELEASE)];
    let mut wanted = Vec::new();
    for release in releases.into_iter().flatten() {
        let package = format!("linux-headers-{release}");
        if crate::kmod::headers_dir(&release).join("Makefile").exists() && dpkg_installed(&package) {
            step(&package, "present");
        } else {
            wanted.push(package);
        }
    }
    if wanted.is_empty() {
        return Ok(());
    }
    step(&wanted.join(" "), "installing");
    apt_install(&wanted)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_order_numerically() {
        let mut v = ["linux-image-6.1.0-9-amd64", "linux-image-6.1.0-56-amd64", "linux-image-6.1.0-55-amd64"];
        v.sort_by_key(|p| version_key(p));
        assert_eq!(v.last(), Some(&"linux-image-6.1.0-56-amd64"));
    }
}
