//! containerd 2.x and runc for the VM tests that run pods through CRI, unpacked beside the
//! kernels, never installed: Debian forky's `containerd` (2.1.x; trixie carries 1.7) runs on
//! bookworm once unpacked (it is statically linked against nothing beyond libc ≥ 2.34), and
//! bookworm's `runc` (1.1.5) runs its containers. The VM sees the host's root read-only, so the
//! tests start containerd from this tree with its root and state on a tmpfs in the guest.
//!
//! Both are pinned ([`PINS`]): a named version, and the SHA-256 of its `.deb` as Debian's signed
//! index gave it when the pin was set (apt checks the download against the index; the pinned sum
//! also catches a rebuild under the same version). Forky is Debian's testing suite and moves, so
//! the day it drops the pinned containerd, setup stops with the versions it offers and how to move
//! the pin (docs/toolchain.md, "Moving the containerd pin") rather than run the tests on whatever
//! the suite holds. `present()` asks the unpacked binaries their version.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{
    kernels::{self, Offered, PrivateApt, Suite},
    util::output,
};

const FORKY: Suite = Suite { uri: "http://deb.debian.org/debian", name: "forky" };
const BOOKWORM: Suite = Suite { uri: "http://deb.debian.org/debian", name: "bookworm" };

/// One package at a named version of a named suite, with its `.deb`'s SHA-256.
struct Pin {
    package: &'static str,
    version: &'static str,
    suite: Suite,
    sha256: &'static str,
}

/// What setup unpacks; moving a pin: docs/toolchain.md, "Moving the containerd pin".
const PINS: [Pin; 2] = [
    Pin {
        package: "containerd",
        version: "2.1.9+ds1-5",
        suite: FORKY,
        sha256: "2dda86ce7033fd612fc50e136679d8174ccad680eb29cd4611e0d2a1b84cf591",
    },
    Pin {
        package: "runc",
        version: "1.1.5+ds1-1+deb12u1",
        suite: BOOKWORM,
        sha256: "a00351f8c0318de0b424ecf5cd0fdb69880a89f3511cae4f6fff7de3e57881c5",
    },
];

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

/// `containerd 2.1.9+ds1-5 (forky) and runc 1.1.5+ds1-1+deb12u1 (bookworm)`, for setup's lines.
pub fn describe() -> String {
    let pins: Vec<String> = PINS.iter().map(|p| format!("{} {} ({})", p.package, p.version, p.suite.name)).collect();
    pins.join(" and ")
}

/// The installed binary of each pin, in [`PINS`]' order.
fn binaries() -> [PathBuf; 2] {
    [bin_dir().join("containerd"), runc()]
}

/// `containerd=2.1.9+ds1-5 runc=1.1.5+ds1-1+deb12u1`: a moved pin is fetched again.
fn stamp() -> String {
    let pins: Vec<String> = PINS.iter().map(|p| format!("{}={}", p.package, p.version)).collect();
    format!("{}\n", pins.join(" "))
}

/// The pinned versions are unpacked, and each binary says it is its pin's version.
pub fn present() -> bool {
    fs::read_to_string(root().join(STAMP)).is_ok_and(|s| s == stamp())
        && bin_dir().join("containerd-shim-runc-v2").exists()
        && bin_dir().join("ctr").exists()
        && PINS.iter().zip(binaries()).all(|(pin, binary)| installed_version(&binary).is_ok_and(|v| pin.reports(&v)))
}

/// The first line of `BINARY --version`.
fn installed_version(binary: &Path) -> Result<String> {
    let out = Command::new(binary)
        .arg("--version")
        .output()
        .with_context(|| format!("running {} --version", binary.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{} --version failed here: {}",
        binary.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or_default().to_owned())
}

impl Pin {
    /// The upstream release a Debian version packages: `2.1.9+ds1-5` → `2.1.9` (no epoch, no
    /// Debian revision, no repack suffix after `+` or `~`).
    fn upstream(&self) -> &'static str {
        let v = self.version.split_once(':').map_or(self.version, |(_, v)| v);
        let v = v.rsplit_once('-').map_or(v, |(v, _)| v);
        v.split(['+', '~']).next().unwrap_or(v)
    }

    /// Does a `--version` line name this pin's release? containerd says `containerd
    /// github.com/containerd/containerd/v2 2.1.9+unknown`, runc `runc version 1.1.5+ds1`: the
    /// third word, up to a `+`.
    fn reports(&self, version_line: &str) -> bool {
        version_line.split_whitespace().nth(2).and_then(|v| v.split('+').next()) == Some(self.upstream())
    }

    /// Fail unless the suite still offers the pinned version, naming what it offers and the fix.
    fn check_offered(&self, offered: &[Offered]) -> Result<()> {
        let suite: Vec<&str> =
            offered.iter().filter(|o| o.suite == self.suite.name).map(|o| o.version.as_str()).collect();
        if suite.contains(&self.version) {
            return Ok(());
        }
        let now = if suite.is_empty() { "no version".to_owned() } else { suite.join(", ") };
        bail!(
            "Debian {suite} no longer offers {package} {version}, the version xtask/src/containerd.rs pins (it offers \
             {now}). Move the pin: set its version and sha256 to what `apt-cache show {package}/{suite}` says, \
             then run `cargo xtask setup` and `cargo xtask test --filter emu_k8s` (docs/toolchain.md, \
             \"Moving the containerd pin\")",
            suite = self.suite.name,
            package = self.package,
            version = self.version,
        );
    }

    /// Fail unless `deb` has the pinned SHA-256.
    fn check_sum(&self, deb: &Path) -> Result<()> {
        let out = output(Command::new("sha256sum").arg(deb))?;
        let found = out.split_whitespace().next().unwrap_or_default();
        anyhow::ensure!(
            found == self.sha256,
            "{}: SHA-256 {found}, but xtask/src/containerd.rs pins {} {} at {}: the download is corrupt, or \
             Debian rebuilt the package under the same version (compare `apt-cache show {}={}`; move the pin's \
             sha256 only if Debian's index agrees)",
            deb.display(),
            self.package,
            self.version,
            self.sha256,
            self.package,
            self.version,
        );
        Ok(())
    }
}

/// Fetch, check and unpack the pinned packages unless they are in place.
pub fn provision() -> Result<()> {
    let apt = PrivateApt::new(&[FORKY, BOOKWORM])?;
    apt.update()?;
    for pin in &PINS {
        pin.check_offered(&apt.offered(pin.package)?)?;
    }
    let debs = kernels::kernels_dir().join(".debs").join("containerd");
    let _ = fs::remove_dir_all(&debs);
    let wanted: Vec<String> = PINS.iter().map(|p| format!("{}={}", p.package, p.version)).collect();
    apt.download(&wanted, &debs)?;
    for pin in &PINS {
        // apt-get download names a file `package_version_arch.deb` (an epoch's `:` as `%3a`).
        let prefix = format!("{}_", pin.package);
        let deb = fs::read_dir(&debs)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&prefix)))
            .with_context(|| format!("apt-get download left no {prefix}*.deb in {}", debs.display()))?;
        pin.check_sum(&deb)?;
    }
    let root = root();
    kernels::unpack_debs(&debs, &root)?;
    for (pin, binary) in PINS.iter().zip(binaries()) {
        let line = installed_version(&binary).context("the unpacked binaries must run on this host")?;
        anyhow::ensure!(
            pin.reports(&line),
            "{} says `{line}`, not {} {}: the package's binary reports another release than its version",
            binary.display(),
            pin.package,
            pin.upstream()
        );
    }
    fs::write(root.join(STAMP), stamp())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offered(version: &str, suite: &str) -> Offered {
        Offered { version: version.into(), suite: suite.into() }
    }

    #[test]
    fn a_pin_names_its_upstream_release_as_the_binary_reports_it() {
        let [containerd, runc] = &PINS;
        assert_eq!(containerd.upstream(), "2.1.9");
        assert_eq!(runc.upstream(), "1.1.5");
        assert!(containerd.reports("containerd github.com/containerd/containerd/v2 2.1.9+unknown "));
        assert!(!containerd.reports("containerd github.com/containerd/containerd/v2 2.2.0+unknown"));
        assert!(runc.reports("runc version 1.1.5+ds1"));
        assert!(!runc.reports("runc version 1.3.6+ds1"));
        assert!(!runc.reports(""));
        assert_eq!(stamp(), "containerd=2.1.9+ds1-5 runc=1.1.5+ds1-1+deb12u1\n");
        assert_eq!(describe(), "containerd 2.1.9+ds1-5 (forky) and runc 1.1.5+ds1-1+deb12u1 (bookworm)");
    }

    #[test]
    fn a_version_the_suite_dropped_is_named_with_what_it_offers_and_the_fix() {
        let containerd = &PINS[0];
        containerd
            .check_offered(&[offered("1.6.20~ds1-1+deb12u3", "bookworm"), offered("2.1.9+ds1-5", "forky")])
            .unwrap();
        let err = containerd
            .check_offered(&[offered("2.1.9+ds1-5", "bookworm"), offered("2.2.1~ds1-1", "forky")])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "Debian forky no longer offers containerd 2.1.9+ds1-5, the version xtask/src/containerd.rs pins (it \
             offers 2.2.1~ds1-1). Move the pin: set its version and sha256 to what `apt-cache show containerd/forky` \
             says, then run `cargo xtask setup` and `cargo xtask test --filter emu_k8s` (docs/toolchain.md, \
             \"Moving the containerd pin\")"
        );
        let err = PINS[1].check_offered(&[]).unwrap_err().to_string();
        assert_eq!(
            err,
            "Debian bookworm no longer offers runc 1.1.5+ds1-1+deb12u1, the version xtask/src/containerd.rs pins (it \
             offers no version). Move the pin: set its version and sha256 to what `apt-cache show runc/bookworm` \
             says, then run `cargo xtask setup` and `cargo xtask test --filter emu_k8s` (docs/toolchain.md, \
             \"Moving the containerd pin\")"
        );
    }
}
