//! Test kernel modules built on the host for a VM kernel: today only the KFD emulator
//! (`tests/kfd-emu/`), loaded by `cargo xtask vm --module kfd-emu` instead of amdgpu.
//!
//! The module is built against the Debian `linux-headers-<release>` package of the kernel
//! (kernels.rs says where, and which `make` variables bookworm's gcc-12 needs) into
//! `target/kfd-emu/<release>/`, with module BTF: the 6.12 and 7.x headers ship a `vmlinux` (BTF
//! only) so Kbuild runs pahole itself; the 6.1 headers do not, so the kernel image is
//! decompressed (what the headers' missing `scripts/extract-vmlinux` would do) and pahole runs on
//! the finished `.ko` with the flags of the headers' `scripts/pahole-flags.sh`. 5.10 loads no
//! module BTF at all (`CONFIG_DEBUG_INFO_BTF_MODULES` is 5.11+), so its module has none.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};
use clap::ValueEnum;

use crate::{
    kernels::Kernel,
    util::{self, output, target_dir, workspace_root},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Module {
    /// The KFD emulator (tests/kfd-emu): /dev/kfd with emulated GPUs 0x1000 and 0x2000.
    #[value(name = "kfd-emu")]
    KfdEmu,
}

impl Module {
    pub fn name(self) -> &'static str {
        match self {
            Module::KfdEmu => "kfd-emu",
        }
    }

    fn sources(self) -> (PathBuf, &'static [&'static str], &'static str) {
        match self {
            Module::KfdEmu => (
                workspace_root().join("tests/kfd-emu"),
                &[
                    "Kbuild",
                    // kfd_emu.ko's objects (Kbuild's kfd_emu-y), then amdgpu_emu.ko's
                    "main.c",
                    "cp.c",
                    "sdma.c",
                    "queues.c",
                    "process.c",
                    "chardev.c",
                    "memory.c",
                    "events.c",
                    "debug.c",
                    "sysfs.c",
                    "topology.c",
                    "kfd_emu.h",
                    "emu_gpu.h",
                    "amdgpu_emu.c",
                ],
                "kfd_emu.ko",
            ),
        }
    }
}

/// Build `module` for `kernel`; returns the path of the `.ko` (with a `.BTF` section where the
/// kernel loads module BTF).
pub fn build(module: Module, kernel: Kernel) -> Result<PathBuf> {
    let release = kernel.release()?;
    let headers = kernel.headers();
    if !headers.join("Makefile").exists() {
        bail!("{} is missing: run `cargo xtask setup` (fetches linux-headers-{release})", headers.display());
    }
    let (src, files, ko_name) = module.sources();
    let out = target_dir().join(module.name()).join(&release);
    fs::create_dir_all(&out)?;
    // Copy only what changed, so make stays incremental.
    for file in files {
        let text = fs::read(src.join(file)).with_context(|| format!("reading {}", src.join(file).display()))?;
        let dest = out.join(file);
        if fs::read(&dest).ok().as_deref() != Some(text.as_slice()) {
            fs::write(&dest, text)?;
        }
    }
    eprintln!("xtask: building {} for {release} in {}", module.name(), out.display());
    util::run(
        Command::new("make")
            .arg("-C")
            .arg(&headers)
            .arg(format!("M={}", out.display()))
            .args(kernel.kbuild_args())
            .args(["-j2", "modules"]),
    )
    .with_context(|| format!("building {} against {}", module.name(), headers.display()))?;
    let ko = out.join(ko_name);
    if !loads_module_btf(&headers)? {
        // CONFIG_DEBUG_INFO_BTF_MODULES appeared in 5.11: 5.10 ignores a module's .BTF, so the
        // tracer has no module BTF there and learns pointers instead.
        return Ok(ko);
    }
    if !has_btf(&ko)? {
        add_btf(&ko, &headers, &kernel.image(), &out)?;
        if !has_btf(&ko)? {
            bail!("pahole did not add a .BTF section to {}", ko.display());
        }
    }
    Ok(ko)
}

fn has_btf(ko: &Path) -> Result<bool> {
    let sections = output(Command::new("readelf").arg("-S").arg("-W").arg(ko))?;
    Ok(sections.lines().any(|l| l.split_whitespace().any(|w| w == ".BTF")))
}

/// Does the kernel of these headers load module BTF (`CONFIG_DEBUG_INFO_BTF_MODULES=y`)?
fn loads_module_btf(headers: &Path) -> Result<bool> {
    let config = headers.join(".config");
    let text = fs::read_to_string(&config).with_context(|| format!("reading {}", config.display()))?;
    Ok(text.lines().any(|l| l.trim() == "CONFIG_DEBUG_INFO_BTF_MODULES=y"))
}

/// Module BTF against the kernel image's BTF (the base pahole deduplicates against).
fn add_btf(ko: &Path, headers: &Path, image: &Path, out: &Path) -> Result<()> {
    let vmlinux = out.join("vmlinux");
    if !vmlinux.exists() {
        extract_vmlinux(image, &vmlinux)?;
    }
    let flags_script = headers.join("scripts/pahole-flags.sh");
    let flags = if flags_script.exists() {
        output(Command::new("sh").arg(&flags_script).env("PAHOLE", "pahole"))?
    } else {
        "-j".to_owned()
    };
    eprintln!("xtask: adding module BTF to {} (pahole {})", ko.display(), flags.trim());
    util::run(
        Command::new("pahole")
            .arg("-J")
            .args(flags.split_whitespace())
            .arg("--btf_base")
            .arg(&vmlinux)
            .arg(ko)
            .env("LLVM_OBJCOPY", "objcopy"),
    )
    .context("pahole failed (is dwarves installed? `cargo xtask setup`)")
}

/// Decompress the ELF kernel inside a bzImage, like the kernel's `scripts/extract-vmlinux`:
/// find the compressed stream by its magic and run the matching decompressor over the rest.
fn extract_vmlinux(vmlinuz: &Path, vmlinux: &Path) -> Result<()> {
    let image = fs::read(vmlinuz).with_context(|| format!("reading {}", vmlinuz.display()))?;
    let formats: [(&[u8], &str, &[&str]); 3] = [
        (b"\xfd7zXZ\x00", "xz", &["-dc"]),
        (b"\x28\xb5\x2f\xfd", "zstd", &["-dcq"]),
        (b"\x1f\x8b\x08", "gzip", &["-dc"]),
    ];
    for (magic, tool, args) in formats {
        let Some(start) = image.windows(magic.len()).position(|w| w == magic) else { continue };
        eprintln!("xtask: extracting vmlinux from {} ({tool} at offset {start})", vmlinuz.display());
        let tmp = vmlinux.with_extension("tmp");
        let mut child = Command::new(tool)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(fs::File::create(&tmp)?)
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {tool}"))?;
        if let Some(mut stdin) = child.stdin.take() {
            // Trailing data after the stream makes the decompressor complain; the output is whole.
            let _ = std::io::Write::write_all(&mut stdin, &image[start..]);
        }
        let _ = child.wait()?;
        let head = fs::read(&tmp).map(|b| b.get(..4) == Some(b"\x7fELF")).unwrap_or(false);
        if head {
            fs::rename(&tmp, vmlinux)?;
            return Ok(());
        }
        let _ = fs::remove_file(&tmp);
    }
    bail!("no xz/zstd/gzip-compressed ELF kernel found in {}", vmlinuz.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xtask copies every source of the module's directory: one Kbuild names but the list lacks
    /// would fail the build only where it runs, in `cargo xtask test`/`vm`.
    #[test]
    fn copies_every_source() -> Result<()> {
        let (dir, files, _) = Module::KfdEmu.sources();
        let mut on_disk = Vec::new();
        for entry in fs::read_dir(&dir)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if name == "Kbuild" || name.ends_with(".c") || name.ends_with(".h") {
                on_disk.push(name);
            }
        }
        on_disk.sort();
        let mut listed: Vec<String> = files.iter().map(|f| (*f).to_owned()).collect();
        listed.sort();
        assert_eq!(listed, on_disk);
        Ok(())
    }
}
