//! The VM kernels: one table ([`KERNELS`]) of the Debian kernels the tests boot, with the exact
//! package versions, and how each reaches this machine.
//!
//! - Debian 12's own kernels (6.1, 6.12) are installed with the host's apt, as any bookworm
//!   package: `/boot/vmlinuz-<release>`, `/lib/modules/<release>`, `/usr/src/linux-headers-*`.
//! - Other suites' kernels (bullseye's 5.10, trixie-backports' 7.x) are never installed on the
//!   host: their packages are fetched with `apt-get download` through a private apt configuration
//!   (its own sources list, lists and cache, the host's keyring) and unpacked with `dpkg-deb -x`
//!   into `~/.local/share/gpreempt/kernels/<release>/`, a tree laid out like a root file system.
//!   virtme-ng finds the modules next to the image there and lends them to the guest over 9p.
//!
//! How to move a pin: docs/toolchain.md ("Moving a kernel pin").

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use clap::ValueEnum;

use crate::util::{self, output};

/// A kernel of the VM matrix, as `--kernel` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Kernel {
    /// Debian 11 bullseye 5.10.223 (KFD 1.3, no debug trap, no module BTF)
    #[value(name = "5.10")]
    V5_10,
    /// Debian 6.1 (KFD 1.11, no debug-trap API)
    #[value(name = "6.1")]
    V6_1,
    /// Debian 6.12.117 (KFD 1.17, debug-trap API)
    #[value(name = "6.12")]
    V6_12,
    /// Debian trixie-backports 7.3.4 (KFD 1.20; /dev/kfd cannot be opened without a GPU)
    #[value(name = "7")]
    V7,
}

/// Where a kernel's files come from.
pub enum Provision {
    /// Installed by the host's apt (the host is Debian 12; these are its own suites' packages).
    Host,
    /// Downloaded from `suite` and unpacked under [`Kernel::root`]; never installed.
    Unpacked {
        /// The apt source line's suite (and archive path) the packages come from.
        suite: Suite,
        /// Where the image is inside the packages (Debian ≥ 7.x: under /usr/lib/modules).
        image: ImagePath,
        /// Host-runnable helpers this kernel's kbuild needs that bookworm lacks (see [`Runtime`]).
        runtime: Option<Runtime>,
    },
}

/// A Debian suite reached through the private apt configuration.
#[derive(Clone, Copy)]
pub struct Suite {
    pub uri: &'static str,
    pub name: &'static str,
}

pub const BULLSEYE: Suite = Suite { uri: "http://deb.debian.org/debian", name: "bullseye" };
pub const TRIXIE: Suite = Suite { uri: "http://deb.debian.org/debian", name: "trixie" };
pub const TRIXIE_BACKPORTS: Suite = Suite { uri: "http://deb.debian.org/debian", name: "trixie-backports" };

#[derive(Clone, Copy)]
pub enum ImagePath {
    /// `boot/vmlinuz-<release>` (Debian ≤ 6.x `linux-image-*` packages).
    Boot,
    /// `usr/lib/modules/<release>/vmlinuz` (Debian 7.x `linux-binary-*` packages).
    UsrLibModules,
}

/// Trixie-built kbuild tools (`modpost`, `objtool`, `resolve_btfids`) need glibc ≥ 2.38 and the
/// kernel's `pahole` flags need pahole ≥ 1.26 (`--btf_features`); bookworm has glibc 2.36 and
/// pahole 1.24. These packages of `suite` are unpacked beside the kernel and the tools run
/// through their dynamic loader (`ld-linux-x86-64.so.2 --library-path`), never installed.
pub struct Runtime {
    pub suite: Suite,
    /// Package names; the suite's current version (a loader for build tools, not under test).
    pub packages: &'static [&'static str],
    /// Kbuild executables (relative to the unpacked root) to run through that loader.
    pub wrap: &'static [&'static str],
}

/// One kernel of the matrix.
pub struct KernelSpec {
    pub kernel: Kernel,
    /// `uname -r` in the guest.
    pub release: &'static str,
    /// The Debian version of every package below (`apt-cache policy` shows it).
    pub version: &'static str,
    /// Exact package names: image, modules, headers (+ common), kbuild.
    pub packages: &'static [&'static str],
    pub provision: Provision,
    /// Extra `make` variables for building test modules against this kernel's headers with
    /// bookworm's gcc-12 (the headers name the gcc the kernel was built with).
    pub kbuild_overrides: &'static [&'static str],
}

/// The matrix. Order: oldest first (the order `cargo xtask test` boots them).
pub const KERNELS: [KernelSpec; 4] = [
    // Debian 11's last point release (11.11) kernel, the 5.10 LTS the proof-of-concept hosts run.
    // bullseye main is frozen since 11.11, so this version stays downloadable.
    KernelSpec {
        kernel: Kernel::V5_10,
        release: "5.10.0-32-amd64",
        version: "5.10.223-1",
        packages: &[
            "linux-image-5.10.0-32-amd64-unsigned",
            "linux-headers-5.10.0-32-amd64",
            "linux-headers-5.10.0-32-common",
            "linux-kbuild-5.10",
        ],
        provision: Provision::Unpacked { suite: BULLSEYE, image: ImagePath::Boot, runtime: None },
        kbuild_overrides: &[],
    },
    KernelSpec {
        kernel: Kernel::V6_1,
        release: "6.1.0-56-amd64",
        version: "6.1.192-2",
        packages: &["linux-image-6.1.0-56-amd64", "linux-headers-6.1.0-56-amd64"],
        provision: Provision::Host,
        kbuild_overrides: &[],
    },
    KernelSpec {
        kernel: Kernel::V6_12,
        release: "6.12.117+deb12-amd64",
        version: "6.12.117-1~deb12u1",
        packages: &["linux-image-6.12.117+deb12-amd64-unsigned", "linux-headers-6.12.117+deb12-amd64"],
        provision: Provision::Host,
        kbuild_overrides: &[],
    },
    // The newest Debian 7.x: trixie-backports (sid had 7.2.13 on the same day). 7.x splits the
    // image (`linux-binary-*`, signed; the image is the same bzImage) from the modules
    // (`linux-modules-*`, `.ko.xz`); `linux-base-*` carries System.map and config.
    KernelSpec {
        kernel: Kernel::V7,
        release: "7.3.4+deb13-amd64",
        version: "7.3.4-1~bpo13+1",
        packages: &[
            "linux-binary-7.3.4+deb13-amd64",
            "linux-modules-7.3.4+deb13-amd64",
            "linux-base-7.3.4+deb13-amd64",
            "linux-headers-7.3.4+deb13-amd64",
            "linux-headers-7.3.4+deb13-common",
            "linux-kbuild-7.3.4+deb13",
        ],
        provision: Provision::Unpacked {
            suite: TRIXIE_BACKPORTS,
            image: ImagePath::UsrLibModules,
            runtime: Some(Runtime {
                suite: TRIXIE,
                packages: &[
                    "libc6",
                    "libelf1t64",
                    "libdw1t64",
                    "libbpf1",
                    "zlib1g",
                    "libzstd1",
                    "liblzma5",
                    "libbz2-1.0",
                    "pahole",
                ],
                wrap: &[
                    "usr/lib/linux-kbuild-7.3.4+deb13/scripts/mod/modpost.real-lsb-64",
                    "usr/lib/linux-kbuild-7.3.4+deb13/tools/objtool/objtool.real-x86",
                    "usr/lib/linux-kbuild-7.3.4+deb13/tools/bpf/resolve_btfids/resolve_btfids",
                    "usr/bin/pahole",
                ],
            }),
        },
        // The headers were configured with gcc-14: CONFIG_CC_HAS_MIN_FUNCTION_ALIGNMENT makes
        // kbuild pass -fmin-function-alignment=16 (gcc ≥ 14); unset, kbuild passes
        // -falign-functions=16 as for any older gcc (Makefile, 6.4+). pahole: the trixie one.
        kbuild_overrides: &["CONFIG_CC_HAS_MIN_FUNCTION_ALIGNMENT=", "PAHOLE={root}/usr/bin/pahole"],
    },
];

impl Kernel {
    /// Every kernel `cargo xtask test` boots, oldest first.
    pub const ALL: [Kernel; 4] = [Kernel::V5_10, Kernel::V6_1, Kernel::V6_12, Kernel::V7];
    /// The kernels `cargo xtask bench` measures the tracers on (rows 1-4).
    pub const MATRIX: [Kernel; 2] = [Kernel::V6_1, Kernel::V6_12];

    pub fn name(self) -> &'static str {
        match self {
            Kernel::V5_10 => "5.10",
            Kernel::V6_1 => "6.1",
            Kernel::V6_12 => "6.12",
            Kernel::V7 => "7",
        }
    }

    pub fn spec(self) -> &'static KernelSpec {
        // KERNELS has one entry per variant (unit-tested).
        KERNELS.iter().find(|s| s.kernel == self).unwrap_or(&KERNELS[0])
    }

    /// The root its files live under: `/` for host-installed kernels.
    pub fn root(self) -> PathBuf {
        match self.spec().provision {
            Provision::Host => PathBuf::from("/"),
            Provision::Unpacked { .. } => kernels_dir().join(self.spec().release),
        }
    }

    /// The kernel image virtme-ng boots; its modules are found relative to it.
    pub fn image(self) -> PathBuf {
        let release = self.spec().release;
        match self.spec().provision {
            Provision::Host | Provision::Unpacked { image: ImagePath::Boot, .. } => {
                self.root().join(format!("boot/vmlinuz-{release}"))
            }
            Provision::Unpacked { image: ImagePath::UsrLibModules, .. } => {
                self.root().join(format!("usr/lib/modules/{release}/vmlinuz"))
            }
        }
    }

    /// `linux-headers-<release>`, where test modules are built against.
    pub fn headers(self) -> PathBuf {
        self.root().join(format!("usr/src/linux-headers-{}", self.spec().release))
    }

    /// The `make` variables for building a module against [`Kernel::headers`].
    pub fn kbuild_args(self) -> Vec<String> {
        let root = self.root();
        // Every Debian kernel's headers name the gcc it was built with (gcc-10 on bullseye,
        // gcc-14 on trixie); bookworm has gcc-12, which builds modules for all four.
        let mut args = vec!["CC=x86_64-linux-gnu-gcc-12".to_owned()];
        args.extend(self.spec().kbuild_overrides.iter().map(|a| a.replace("{root}", &root.display().to_string())));
        args
    }

    /// The release when the kernel is in place, or a message saying how to get it.
    pub fn release(self) -> Result<String> {
        let spec = self.spec();
        if self.image().exists() && self.modules_dir().join("modules.dep").exists() {
            Ok(spec.release.to_owned())
        } else {
            bail!("the Debian {} kernel ({}) is not in place: run `cargo xtask setup`", self.name(), spec.release)
        }
    }

    fn modules_dir(self) -> PathBuf {
        let release = self.spec().release;
        match self.spec().provision {
            Provision::Unpacked { image: ImagePath::UsrLibModules, .. } => {
                self.root().join(format!("usr/lib/modules/{release}"))
            }
            _ => self.root().join(format!("lib/modules/{release}")),
        }
    }
}

/// `~/.local/share/gpreempt/kernels`, beside the bpf-linker LLVM prefix.
pub fn kernels_dir() -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".local/share/gpreempt/kernels")
}

/// What [`provision`] records when an unpacked kernel is complete: its packages and version, so
/// a moved pin is fetched again.
fn stamp(spec: &KernelSpec) -> String {
    format!("{} {}\n", spec.version, spec.packages.join(" "))
}

const STAMP: &str = ".gpreempt-kernel";

/// Is `kernel` in place with the pinned packages?
pub fn present(kernel: Kernel) -> bool {
    let spec = kernel.spec();
    match spec.provision {
        Provision::Host => {
            kernel.release().is_ok()
                && kernel.headers().join("Makefile").exists()
                && spec.packages.iter().all(|p| dpkg_version(p).as_deref() == Some(spec.version))
        }
        Provision::Unpacked { .. } => {
            fs::read_to_string(kernel.root().join(STAMP)).is_ok_and(|s| s == stamp(spec)) && kernel.release().is_ok()
        }
    }
}

fn dpkg_version(package: &str) -> Option<String> {
    let out = Command::new("dpkg-query").args(["-W", "-f=${Status} ${Version}", package]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.strip_prefix("install ok installed ").map(str::to_owned)
}

/// The private apt configuration: its own sources list, lists, cache and no dpkg status, so
/// nothing of the host's apt changes.
pub(crate) struct PrivateApt {
    dir: PathBuf,
}

impl PrivateApt {
    pub(crate) fn new(suites: &[Suite]) -> Result<PrivateApt> {
        let dir = kernels_dir().join(".apt");
        fs::create_dir_all(dir.join("lists/partial"))?;
        fs::create_dir_all(dir.join("cache/archives/partial"))?;
        let mut list = String::new();
        for s in suites {
            list.push_str(&format!(
                "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {} {} main\n",
                s.uri, s.name
            ));
        }
        fs::write(dir.join("sources.list"), list)?;
        Ok(PrivateApt { dir })
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        let d = self.dir.display();
        for opt in [
            format!("Dir::Etc::SourceList={d}/sources.list"),
            "Dir::Etc::SourceParts=/dev/null".to_owned(),
            format!("Dir::State::Lists={d}/lists"),
            format!("Dir::Cache={d}/cache"),
            "Dir::State::status=/dev/null".to_owned(),
            "APT::Architecture=amd64".to_owned(),
            "Acquire::Languages=none".to_owned(),
            // Files land in our own directory, which the _apt user may not be able to write.
            "APT::Sandbox::User=root".to_owned(),
        ] {
            cmd.arg("-o").arg(opt);
        }
        cmd
    }

    pub(crate) fn update(&self) -> Result<()> {
        util::run(self.command("apt-get").args(["update", "-q"])).context("apt-get update (private lists) failed")
    }

    /// The versions of `package` the suites offer, each with its suite (`apt-cache madison`).
    pub(crate) fn offered(&self, package: &str) -> Result<Vec<Offered>> {
        let text = output(self.command("apt-cache").args(["madison", package]))
            .with_context(|| format!("apt-cache madison {package} (private lists)"))?;
        Ok(parse_madison(&text))
    }

    /// Download `specs` (`name=version` or `name/suite`) into `into`.
    pub(crate) fn download(&self, specs: &[String], into: &Path) -> Result<()> {
        fs::create_dir_all(into)?;
        let mut cmd = self.command("apt-get");
        cmd.arg("download").arg("-q").args(specs).current_dir(into);
        let status = cmd.status().context("cannot start apt-get")?;
        if !status.success() {
            bail!(
                "apt-get download {} failed: Debian may have dropped a pinned version; see \
                 docs/toolchain.md (\"Moving a kernel pin\") and `apt-cache policy` through {}",
                specs.join(" "),
                self.dir.join("sources.list").display()
            );
        }
        Ok(())
    }
}

/// One version of a package that a suite offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Offered {
    pub version: String,
    pub suite: String,
}

/// `apt-cache madison`'s lines, ` containerd | 2.1.9+ds1-5 | http://deb.debian.org/debian
/// forky/main amd64 Packages`: the version and the suite (before the component).
fn parse_madison(text: &str) -> Vec<Offered> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split('|').map(str::trim);
            let (_, version, source) = (fields.next()?, fields.next()?, fields.next()?);
            let suite = source.split_whitespace().nth(1)?.split('/').next()?;
            Some(Offered { version: version.to_owned(), suite: suite.to_owned() })
        })
        .collect()
}

/// Fetch and unpack `kernel` (an [`Provision::Unpacked`] one) unless it is in place.
pub fn unpack(kernel: Kernel) -> Result<()> {
    let spec = kernel.spec();
    let Provision::Unpacked { suite, runtime, .. } = &spec.provision else {
        bail!("the {} kernel is installed by apt, not unpacked", kernel.name());
    };
    let mut suites = vec![*suite];
    if let Some(rt) = runtime {
        suites.push(rt.suite);
    }
    let apt = PrivateApt::new(&suites)?;
    apt.update()?;
    let root = kernel.root();
    let debs = kernels_dir().join(".debs").join(spec.release);
    let _ = fs::remove_dir_all(&debs);
    let mut wanted: Vec<String> = spec.packages.iter().map(|p| format!("{p}={}", spec.version)).collect();
    if let Some(rt) = runtime {
        wanted.extend(rt.packages.iter().map(|p| format!("{p}/{}", rt.suite.name)));
    }
    apt.download(&wanted, &debs)?;
    unpack_debs(&debs, &root)?;
    relocate_headers(kernel)?;
    if let Some(rt) = runtime {
        wrap_runtime(&root, rt)?;
    }
    depmod(kernel)?;
    fs::write(root.join(STAMP), stamp(spec))?;
    Ok(())
}

/// Unpack every package in `debs` into `root` (replaced whole: staged beside it, then renamed,
/// so an interrupted unpack never looks complete), then remove `debs`.
pub(crate) fn unpack_debs(debs: &Path, root: &Path) -> Result<()> {
    let staging = root.with_extension("partial");
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(&staging)?;
    for deb in fs::read_dir(debs)? {
        let deb = deb?.path();
        util::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&staging))
            .with_context(|| format!("unpacking {}", deb.display()))?;
    }
    let _ = fs::remove_dir_all(root);
    fs::rename(&staging, root)?;
    let _ = fs::remove_dir_all(debs);
    Ok(())
}

/// The headers' Makefile includes the common headers by absolute path (`include
/// /usr/src/linux-headers-<release>-common/Makefile`; 7.x also sets `KBUILD_OUTPUT=/usr/src/…`):
/// point both into the unpacked tree. Every other link in the packages is relative.
fn relocate_headers(kernel: Kernel) -> Result<()> {
    let makefile = kernel.headers().join("Makefile");
    let text = fs::read_to_string(&makefile).with_context(|| format!("reading {}", makefile.display()))?;
    let root = kernel.root().display().to_string();
    let fixed = text
        .replace("include /usr/src/", &format!("include {root}/usr/src/"))
        .replace("KBUILD_OUTPUT=/usr/src/", &format!("KBUILD_OUTPUT={root}/usr/src/"));
    fs::write(&makefile, fixed)?;
    Ok(())
}

/// Replace each tool of `rt.wrap` with a script running it through the unpacked loader.
fn wrap_runtime(root: &Path, rt: &Runtime) -> Result<()> {
    let libs = root.join("usr/lib/x86_64-linux-gnu");
    let loader = libs.join("ld-linux-x86-64.so.2");
    if !loader.exists() {
        bail!("{} missing after unpacking {}", loader.display(), rt.packages.join(" "));
    }
    for tool in rt.wrap {
        let path = root.join(tool);
        let real = path.with_file_name(format!(
            "{}.{}",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("tool"),
            rt.suite.name
        ));
        fs::rename(&path, &real).with_context(|| format!("{} missing in the packages", path.display()))?;
        let script = format!(
            "#!/bin/sh\n# gpreempt `cargo xtask setup`: built for {suite}'s glibc (>= 2.38); the host's is older.\n\
             exec '{loader}' --library-path '{libs}' '{real}' \"$@\"\n",
            suite = rt.suite.name,
            loader = loader.display(),
            libs = libs.display(),
            real = real.display(),
        );
        fs::write(&path, script)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))?;
    }
    // The wrapped tools must run on this host; one call proves the loader works.
    if let Some(tool) = rt.wrap.last() {
        output(Command::new(root.join(tool)).arg("--version"))
            .context("a wrapped kbuild tool does not run on this host")?;
    }
    Ok(())
}

/// `modules.dep` for the guest's modprobe (Debian generates it at install time, so the packages
/// do not carry it).
fn depmod(kernel: Kernel) -> Result<()> {
    let base = match kernel.spec().provision {
        Provision::Unpacked { image: ImagePath::UsrLibModules, .. } => kernel.root().join("usr"),
        _ => kernel.root(),
    };
    util::run(Command::new("depmod").arg("-a").arg("-b").arg(&base).arg(kernel.spec().release))
        .context("depmod on the unpacked modules failed")
}

/// apt-get install the packages of a [`Provision::Host`] kernel at the pinned version.
pub fn host_install_args(kernel: Kernel) -> Vec<String> {
    let spec = kernel.spec();
    spec.packages.iter().map(|p| format!("{p}={}", spec.version)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn madison_lines_give_each_version_with_its_suite() {
        let text = " containerd | 2.1.9+ds1-5 | http://deb.debian.org/debian forky/main amd64 Packages\n \
                    containerd | 1.6.20~ds1-1+deb12u3 | http://deb.debian.org/debian bookworm/main amd64 Packages\n";
        assert_eq!(
            parse_madison(text),
            [
                Offered { version: "2.1.9+ds1-5".into(), suite: "forky".into() },
                Offered { version: "1.6.20~ds1-1+deb12u3".into(), suite: "bookworm".into() },
            ]
        );
        assert_eq!(parse_madison("N: Unable to locate package containerd\n"), []);
    }

    #[test]
    fn one_table_entry_per_kernel_in_order() {
        for (i, k) in Kernel::ALL.iter().enumerate() {
            assert_eq!(KERNELS[i].kernel, *k);
            assert_eq!(k.spec().kernel, *k);
        }
    }

    #[test]
    fn paths_follow_the_packages_layout() {
        assert_eq!(Kernel::V6_12.image(), PathBuf::from("/boot/vmlinuz-6.12.117+deb12-amd64"));
        assert_eq!(Kernel::V6_1.headers(), PathBuf::from("/usr/src/linux-headers-6.1.0-56-amd64"));
        let k7 = Kernel::V7.image();
        assert!(k7.ends_with("kernels/7.3.4+deb13-amd64/usr/lib/modules/7.3.4+deb13-amd64/vmlinuz"), "{k7:?}");
        let k5 = Kernel::V5_10.image();
        assert!(k5.ends_with("kernels/5.10.0-32-amd64/boot/vmlinuz-5.10.0-32-amd64"), "{k5:?}");
        let args = Kernel::V7.kbuild_args();
        assert_eq!(args[0], "CC=x86_64-linux-gnu-gcc-12");
        assert!(args[2].starts_with("PAHOLE=/") && args[2].ends_with("/kernels/7.3.4+deb13-amd64/usr/bin/pahole"));
    }
}
