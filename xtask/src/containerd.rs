//! containerd 2.x and runc for the VM tests that run pods through CRI, unpacked beside the
//! kernels, never installed: Debian forky's `containerd` (2.1.x; trixie carries 1.7) runs on
//! bookworm once unpacked (it is statically linked against nothing beyond libc ≥ 2.34), and
//! bookworm's `runc` (1.1.5) runs its containers. The VM sees the host's root read-only, so the
//! tests start containerd from this tree with its root and state on a tmpfs in the guest.
//! Forky is Debian's testing suite and moves: the packages are taken by suite, not pinned, and
//! the versions unpacked are recorded in the stamp.

use std::{fs, path::PathBuf, process::Command};

use anyhow::{Context, Result};

use crate::kernels::{self, PrivateApt, Suite};

const FORKY: Suite = Suite { uri: "http://deb.debian.org/debian", name: "forky" };
const BOOKWORM: Suite = Suite { uri: "http://deb.debian.org/debian", name: "bookworm" };

/// The packages, by suite.
const PACKAGES: &[&str] = &["containerd/forky", "runc/bookworm"];

const STAMP: &str = ".gpreempt-containerd";

/// `~/.local/share/gpreempt/containerd`.
pub fn root() -> PathBuf {
    kernels::kernels_dir().with_file_name("containerd")
}

/// `containerd`, `ctr` and the shim.
pub fn bin_dir() -> PathBuf {
    root().join("usr/bin")
}

/// `runc` (bookworm installs it in /usr/sbin).
pub fn runc() -> PathBuf {
    root().join("usr/sbin/runc")
}

pub fn present() -> bool {
    fs::read_to_string(root().join(STAMP)).is_ok_and(|s| s.starts_with(&PACKAGES.join(" ")))
        && bin_dir().join("containerd").exists()
        && bin_dir().join("containerd-shim-runc-v2").exists()
        && bin_dir().join("ctr").exists()
        && runc().exists()
}

/// Fetch and unpack the two packages unless they are in place.
pub fn provision() -> Result<()> {
    let apt = PrivateApt::new(&[FORKY, BOOKWORM])?;
    apt.update()?;
    let debs = kernels::kernels_dir().join(".debs").join("containerd");
    let _ = fs::remove_dir_all(&debs);
    let wanted: Vec<String> = PACKAGES.iter().map(|p| (*p).to_owned()).collect();
    apt.download(&wanted, &debs)?;
    let mut names: Vec<String> =
        fs::read_dir(&debs)?.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned())).collect();
    names.sort();
    let root = root();
    kernels::unpack_debs(&debs, &root)?;
    // Said once: the version that runs, as the tests will use it.
    let version = Command::new(bin_dir().join("containerd"))
        .arg("--version")
        .output()
        .context("running the unpacked containerd --version")?;
    anyhow::ensure!(
        version.status.success(),
        "the unpacked containerd does not run here: {}",
        String::from_utf8_lossy(&version.stderr)
    );
    fs::write(root.join(STAMP), format!("{}\n{}\n", PACKAGES.join(" "), names.join(" ")))?;
    Ok(())
}
