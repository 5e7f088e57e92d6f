//! `cargo xtask image`: the gpreempt container image (deploy/Containerfile), built offline with
//! Debian's podman (`cargo xtask setup` installs it): `FROM scratch`, no registry pull; tagged
//! `localhost/gpreempt:VERSION` ([`name`]), the name deploy/kubernetes runs, and `gpreempt:latest`.
//!
//! The name is fully qualified because containerd's CRI expands a short one: a DaemonSet asking
//! for `gpreempt:0.1.0` looks for `docker.io/library/gpreempt:0.1.0`, which an imported
//! `localhost/gpreempt:0.1.0` (podman's name for `gpreempt:0.1.0`) is not, and the kubelet pulls.
//!
//! The build context is assembled here: `rootfs/usr/bin/<binary>` (debug sections stripped) and,
//! unless it is static (`cargo xtask dist` builds the image `localhost/gpreempt:VERSION` from its static
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
    /// A further name and tag for the image; it is always tagged localhost/gpreempt:VERSION (the
    /// workspace's version, the name deploy/kubernetes runs) too.
    #[arg(long, default_value = "gpreempt:latest")]
    pub tag: String,
    /// Package this gpreempt binary instead of building the release one.
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// Also write the image, as localhost/gpreempt:VERSION, to this OCI archive (`podman load -i
    /// FILE` or `ctr -n k8s.io images import FILE` on another machine).
    #[arg(long)]
    pub save: Option<PathBuf>,
}

/// The image's name, fully qualified as deploy/kubernetes/base names it: what `podman load` and
/// `ctr images import` of the saved archive call it, and what containerd's CRI looks up.
pub fn name(version: &str) -> String {
    format!("localhost/gpreempt:{version}")
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
    let tags = tags(&crate::util::package_version()?, &args.tag);
    run_command(&mut build_command(&context, &tags))?;
    if let Some(archive) = &args.save {
        let archive = archive.to_str().context("the --save path is not UTF-8")?;
        // An OCI archive names one image: the versioned one, which the manifests run.
        run_command(Command::new("podman").args(["save", "--format", "oci-archive", "--output", archive, &tags[0]]))?;
    }
    let size = output(Command::new("podman").args(["image", "inspect", "--format", "{{.Size}}", &tags[0]]))?;
    println!("xtask image: {} built ({} bytes)", tags.join(", "), size.trim());
    Ok(())
}

/// The image's tags: [`name`] (a kubelet pulls a `:latest` image at every start unless told
/// otherwise; a versioned tag with `imagePullPolicy: IfNotPresent` runs what the node has), then
/// `extra` unless it is that one.
fn tags(version: &str, extra: &str) -> Vec<String> {
    let versioned = name(version);
    if extra == versioned { vec![versioned] } else { vec![versioned, extra.to_owned()] }
}

/// `podman build` of `context` with the project's Containerfile, named by every one of `tags`:
/// never pulls, no network.
pub fn build_command<S: AsRef<std::ffi::OsStr>>(context: &Path, tags: &[S]) -> Command {
    let mut cmd = Command::new("podman");
    cmd.args(["build", "--pull=never", "--network=none", "--file"]).arg(containerfile());
    for tag in tags {
        cmd.arg("--tag").arg(tag);
    }
    cmd.arg(context);
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
    fn the_image_is_tagged_with_the_version_first_and_the_extra_tag_once() {
        assert_eq!(tags("0.1.0", "gpreempt:latest"), ["localhost/gpreempt:0.1.0", "gpreempt:latest"]);
        assert_eq!(tags("0.1.0", "localhost/gpreempt:0.1.0"), ["localhost/gpreempt:0.1.0"]);
        let cmd = build_command(Path::new("/ctx"), &tags("0.1.0", "registry.example/gpreempt:dev"));
        let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        let file = containerfile().display().to_string();
        assert_eq!(
            args,
            [
                "build",
                "--pull=never",
                "--network=none",
                "--file",
                file.as_str(),
                "--tag",
                "localhost/gpreempt:0.1.0",
                "--tag",
                "registry.example/gpreempt:dev",
                "/ctx"
            ]
        );
    }

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

    /// The DaemonSet asks for exactly the name the image is built and saved under, fully
    /// qualified: containerd's CRI would expand a short name to docker.io/library/….
    #[test]
    fn the_kustomization_runs_the_image_by_its_fully_qualified_name() {
        let text = fs::read_to_string(workspace_root().join("deploy/kubernetes/base/kustomization.yaml")).unwrap();
        let images = &text[text.find("\nimages:").expect("an images: list")..];
        let field = |key: &str| {
            images.lines().find_map(|l| l.trim().trim_start_matches("- ").strip_prefix(key)).unwrap().trim().to_owned()
        };
        let version = crate::util::package_version().unwrap();
        assert_eq!(format!("{}:{}", field("name:"), field("newTag:")), name(&version));
        let ds = fs::read_to_string(workspace_root().join("deploy/kubernetes/base/daemonset.yaml")).unwrap();
        assert!(ds.contains(&format!("\n          image: {}\n", field("name:"))), "{ds}");
    }
}
