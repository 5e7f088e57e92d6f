//! `cargo xtask image`: the gpreempt container image (deploy/Containerfile), built offline with
//! Debian's podman (`cargo xtask setup` installs it): `FROM scratch`, no registry pull.
//!
//! The build context is assembled here: `rootfs/usr/bin/<binary>` (debug sections stripped) and,
//! unless it is static (`cargo xtask dist` builds the image `gpreempt:VERSION` from its static
//! binary: nothing else goes in), every shared object `ldd` names for it, copied (symlinks followed) to the path `ldd` names, so
//! the loader finds them where the binary's `PT_INTERP` and the loader's search path point. The
//! VM tests assemble the same way from the debug binaries and build the image inside the guest.

use std::{
    fs, io,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::util::{cargo, output, run as run_command, succeeds, target_dir, workspace_root};

#[derive(Args, Debug)]
pub struct ImageArgs {
    /// The image's name and tag (deploy/daemonset.yaml runs gpreempt:latest).
    #[arg(long, default_value = "gpreempt:latest")]
    pub tag: String,
    /// Package this gpreempt binary instead of building the release one.
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// Also write the image to this OCI archive (`podman load -i FILE` on another machine).
    #[arg(long)]
    pub save: Option<PathBuf>,
}

/// The Containerfile every gpreempt image is built from.
pub fn containerfile() -> PathBuf {
    workspace_root().join("deploy/Containerfile")
}

pub fn run(args: &ImageArgs) -> Result<()> {
    if !succeeds("podman", &["--version"]) {
        bail!("podman not found: run `cargo xtask setup` (installs Debian's podman and crun)");
    }
    let binary = match &args.binary {
        Some(binary) => binary.clone(),
        None => {
            run_command(cargo().args(["build", "--release", "--package", "gpreempt"]))?;
            target_dir().join("release/gpreempt")
        }
    };
    let context = target_dir().join("image/context");
    assemble(&[binary], &context)?;
    run_command(&mut build_command(&context, &args.tag))?;
    if let Some(archive) = &args.save {
        let archive = archive.to_str().context("the --save path is not UTF-8")?;
        run_command(Command::new("podman").args(["save", "--format", "oci-archive", "--output", archive, &args.tag]))?;
    }
    let size = output(Command::new("podman").args(["image", "inspect", "--format", "{{.Size}}", &args.tag]))?;
    println!("xtask image: {} built ({} bytes)", args.tag, size.trim());
    Ok(())
}

/// `podman build` of `context` with the project's Containerfile: never pulls, no network.
pub fn build_command(context: &Path, tag: &str) -> Command {
    let mut cmd = Command::new("podman");
    cmd.args(["build", "--pull=never", "--network=none", "--file"])
        .arg(containerfile())
        .args(["--tag", tag])
        .arg(context);
    cmd
}

/// A fresh build context at `context`: `rootfs/` with `binaries` in `/usr/bin` and their shared
/// objects.
pub fn assemble(binaries: &[PathBuf], context: &Path) -> Result<()> {
    match fs::remove_dir_all(context) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing {}", context.display()));
        }
        _ => {}
    }
    let rootfs = context.join("rootfs");
    let bin = rootfs.join("usr/bin");
    fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
    let mut objects = Vec::new();
    for binary in binaries {
        let name = binary.file_name().with_context(|| format!("{} has no file name", binary.display()))?;
        // The debug sections are most of a debug build (118 MB → ~30 MB) and nothing reads them.
        run_command(Command::new("objcopy").arg("--strip-debug").arg(binary).arg(bin.join(name)))
            .with_context(|| format!("copying {} into the image (objcopy from binutils)", binary.display()))?;
        // A static binary (`cargo xtask dist`) needs nothing beside it; `ldd` would fail on a
        // non-PIE one ("not a dynamic executable").
        let headers = output(Command::new("readelf").args(["--program-headers", "--dynamic", "--wide"]).arg(binary))
            .with_context(|| format!("reading the ELF headers of {} (readelf, from binutils)", binary.display()))?;
        if crate::linkage::dynamic_needs(&headers).is_empty() {
            continue;
        }
        for object in parse_ldd(&output(Command::new("ldd").arg(binary))?)
            .with_context(|| format!("the shared objects of {}", binary.display()))?
        {
            if !objects.contains(&object) {
                objects.push(object);
            }
        }
    }
    for object in &objects {
        let relative = object.strip_prefix("/").with_context(|| format!("{} is not absolute", object.display()))?;
        let to = rootfs.join(relative);
        if let Some(dir) = to.parent() {
            fs::create_dir_all(dir)?;
        }
        fs::copy(object, &to).with_context(|| format!("copying {} to {}", object.display(), to.display()))?;
    }
    Ok(())
}

/// The files of `ldd`'s output: `name => /path (0x…)` and `/path (0x…)` lines; the vDSO has no
/// file. A library `ldd` cannot find is an error, not an image that fails at start.
fn parse_ldd(text: &str) -> Result<Vec<PathBuf>> {
    let mut objects = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let path = match line.split_once("=>") {
            Some((name, target)) => {
                let target = target.trim();
                if target.starts_with("not found") {
                    bail!("ldd: {} not found; install the package that provides it", name.trim());
                }
                target.split_whitespace().next().unwrap_or_default()
            }
            None => line.split_whitespace().next().unwrap_or_default(),
        };
        if path.starts_with('/') {
            objects.push(PathBuf::from(path));
        }
    }
    Ok(objects)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_every_file_and_refuses_a_missing_one() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f8c)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f8c)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f8c)\n";
        assert_eq!(
            parse_ldd(text).unwrap(),
            ["/lib/x86_64-linux-gnu/libgcc_s.so.1", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"]
                .map(PathBuf::from)
        );
        assert_eq!(parse_ldd("\tstatically linked\n").unwrap(), Vec::<PathBuf>::new());
        let err = parse_ldd("\tlibfoo.so.1 => not found\n").unwrap_err();
        assert_eq!(err.to_string(), "ldd: libfoo.so.1 not found; install the package that provides it");
    }
}
