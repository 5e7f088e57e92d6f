//! `cargo xtask dist`: the release artifacts, in `target/dist/`, that need nothing on the target
//! but an x86-64 Linux kernel (no libc, no toolchain):
//!
//! - `gpreempt-VERSION-x86_64-linux.tar.gz`: the static `gpreempt` binary (the eBPF object
//!   inside, as every build embeds it), its man pages, the bash/zsh/fish completions, the systemd
//!   unit and the sample agent configuration (its policy commented out);
//! - `gpreempt_VERSION_amd64.deb` ([`deb`]): the same files where Debian puts them;
//! - `gpreempt-VERSION.oci.tar`: the container image `localhost/gpreempt:VERSION` from the same binary
//!   (`image.rs`), for `podman load -i` / `docker load -i` elsewhere;
//! - `SHA256SUMS`.
//!
//! `--check` ([`check`]) then installs the package in a Debian 11 (bullseye, glibc 2.31) root
//! made by debootstrap and runs `gpreempt doctor` there, chrooted on the host (and in a guest
//! with `--guest`).

pub mod check;
pub mod deb;

use std::{
    fs, io,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::{
    linkage::dynamic_needs,
    util::{cargo, output, output_in, package_version, run as run_command, succeeds, target_dir, workspace_root},
};

/// The one target the artifacts are built for.
///
/// glibc, linked statically (`crt-static`): the machine's only toolchain has no musl target
/// (`rustup target list --installed` lists x86_64-unknown-linux-gnu alone, and no other can be
/// fetched here). Static glibc cannot do what needs its shared objects at run time: NSS lookups
/// (getpwnam, getgrnam, getaddrinfo, gethostbyname), iconv and dlopen; the linker warns of each
/// one a program calls ("Using 'getaddrinfo' in statically linked applications requires at
/// runtime the shared libraries from the glibc version used for linking"), and the build below
/// turns those messages into an error. gpreempt calls none of them: every address it takes is an
/// IP:PORT parsed into a `SocketAddr` (agent `--metrics-addr`, `top --agent`), the hostname comes
/// from /proc/sys/kernel/hostname, users are numbers (`/proc/PID/status`), and nothing is loaded
/// at run time. glibc's libc.a links its own static `dlopen` into every static program
/// (`vtables.o` and `rtld_static_init.o` refer to `__dlopen`; no warning, as no caller outside
/// glibc asks for it), and std's one `dlsym` (`__pthread_get_minstack`, for thread stack sizes)
/// finds nothing in a static binary and falls back to PTHREAD_STACK_MIN.
pub const TARGET: &str = "x86_64-unknown-linux-gnu";

/// What the linker says of a glibc function a static program calls but cannot use fully.
const STATIC_GLIBC_WARNING: &str = "in statically linked applications requires at runtime";

/// glibc's NSS entry points, which a static program can only use with the build machine's shared
/// glibc at run time: none may be in the binary (a second check beside the linker's warnings).
pub const NEEDS_SHARED_GLIBC: &[&str] = &[
    "getaddrinfo",
    "gethostbyname",
    "gethostbyname_r",
    "gethostbyaddr",
    "getservbyname",
    "getpwnam",
    "getpwnam_r",
    "getpwuid",
    "getpwuid_r",
    "getgrnam",
    "getgrnam_r",
    "getgrgid",
    "getgrgid_r",
    "getgrouplist",
    "initgroups",
    "iconv_open",
];

#[derive(Args, Debug)]
pub struct DistArgs {
    /// Do not build the container image (it needs podman: `cargo xtask setup`).
    #[arg(long)]
    pub no_image: bool,
    /// Then install the package in a Debian 11 root (bullseye, glibc 2.31; debootstrap, cached in
    /// target/dist-check/) with dpkg, chrooted, and check `gpreempt doctor` there (root).
    #[arg(long)]
    pub check: bool,
    /// With --check: also boot the 6.12 guest (`cargo xtask vm`, no amdgpu) and run the same
    /// check there, chrooted into a copy of that root.
    #[arg(long, requires = "check")]
    pub guest: bool,
    /// With --check: check the package already in target/dist instead of building it again.
    #[arg(long, requires = "check")]
    pub no_build: bool,
    /// The Debian mirror debootstrap fetches bullseye from.
    #[arg(long, default_value = "http://deb.debian.org/debian")]
    pub mirror: String,
}

/// What a build produced.
pub struct Artifacts {
    pub version: String,
    pub deb: PathBuf,
}

pub fn run(args: &DistArgs) -> Result<()> {
    let version = package_version()?;
    let dist = dist_dir();
    let artifacts = if args.no_build {
        let artifacts = Artifacts { deb: dist.join(deb::file_name(&version)), version };
        if !artifacts.deb.exists() {
            bail!("{} does not exist: run `cargo xtask dist` first (or drop --no-build)", artifacts.deb.display());
        }
        artifacts
    } else {
        build(&dist, &version, !args.no_image)?
    };
    if args.check {
        check::run(&artifacts, args)?;
    }
    Ok(())
}

/// `target/dist`: the artifacts and nothing else.
pub fn dist_dir() -> PathBuf {
    target_dir().join("dist")
}

/// `gpreempt-VERSION-x86_64-linux`: the tarball's top directory.
fn tree_name(version: &str) -> String {
    format!("gpreempt-{version}-x86_64-linux")
}

/// `gpreempt-VERSION.oci.tar`: the image, saved.
fn image_archive(version: &str) -> String {
    format!("gpreempt-{version}.oci.tar")
}

fn build(dist: &Path, version: &str, image: bool) -> Result<Artifacts> {
    if !cfg!(target_arch = "x86_64") {
        bail!("cargo xtask dist builds the x86-64 artifacts and runs on an x86-64 host only");
    }
    // Before the long build: what the later steps need.
    for (tool, from) in [("objcopy", "binutils"), ("readelf", "binutils"), ("dpkg-deb", "dpkg"), ("gzip", "gzip")] {
        if !succeeds(tool, &["--version"]) {
            bail!("{tool} not found: install Debian's {from} (`apt-get install {from}`)");
        }
    }
    if image && !succeeds("podman", &["--version"]) {
        bail!("podman not found: run `cargo xtask setup` (Debian's podman), or pass --no-image");
    }
    remove_dir(dist)?;
    fs::create_dir_all(dist).with_context(|| format!("creating {}", dist.display()))?;

    // Target-specific flags apply to the target's artifacts only: build scripts and proc macros
    // stay dynamic (they run here), and gpreempt's build script gives the nested eBPF build its
    // own CARGO_ENCODED_RUSTFLAGS. RUSTFLAGS from the environment would override them, so they
    // are cleared; the static check below catches anything else.
    // `-W linker-messages` (the final link only) shows what the linker says; cargo replays it
    // when nothing was rebuilt, so the check holds on every run.
    let linker = build_streaming(
        cargo()
            .args(["rustc", "--release", "--package", "gpreempt", "--bin", "gpreempt", "--target", TARGET])
            .args(["--", "-W", "linker-messages"])
            .env("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS", "-C target-feature=+crt-static")
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS"),
    )?;
    let warned: Vec<&str> = linker.lines().filter(|l| l.contains(STATIC_GLIBC_WARNING)).collect();
    if !warned.is_empty() {
        bail!(
            "the static link calls glibc functions that need the build machine's shared glibc at run time:\n{}\n\
             use an IP address or a numeric id instead, or find the dependency that calls them",
            warned.join("\n")
        );
    }
    let built = target_dir().join(TARGET).join("release/gpreempt");
    check_static(&built)?;

    let tree = dist.join(tree_name(version));
    fs::create_dir_all(&tree)?;
    let binary = tree.join("gpreempt");
    // Line tables (release `debug = 1`) are most of the file and nothing on a user's host reads
    // them; the symbol table stays, for backtraces.
    run_command(Command::new("objcopy").arg("--strip-debug").arg(&built).arg(&binary))
        .context("stripping the binary (objcopy, from binutils)")?;
    // What a user's tools say of it: `file` "static-pie linked", `ldd` "statically linked".
    for tool in ["file", "ldd"] {
        let said = output(Command::new(tool).arg(&binary)).unwrap_or_else(|e| format!("{e:#}\n"));
        print!("xtask dist: {tool}: {}", said.trim_start().replace(&format!("{}: ", binary.display()), ""));
    }
    let said = output(Command::new(&binary).arg("--version"))?;
    if said.trim() != format!("gpreempt {version}") {
        bail!("{} --version says `{}`, Cargo.toml says {version}", binary.display(), said.trim());
    }

    let generated = generate(&binary, &tree)?;
    let deploy = workspace_root().join("deploy");
    let unit = fs::read_to_string(deploy.join("gpreempt-agent.service")).context("reading the systemd unit")?;
    fs::write(tree.join("gpreempt-agent.service"), &unit)?;
    let sample = fs::read_to_string(deploy.join("agent.toml")).context("reading deploy/agent.toml")?;
    let sample = deb::comment_out_policies(&sample);
    fs::write(tree.join("agent.toml"), &sample)?;
    for license in ["LICENSE-MIT", "LICENSE-APACHE"] {
        fs::copy(workspace_root().join(license), tree.join(license))?;
    }
    let tarball = dist.join(format!("{}.tar.gz", tree_name(version)));
    run_command(
        Command::new("tar")
            .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner", "-czf"])
            .arg(&tarball)
            .arg("-C")
            .arg(dist)
            .arg(tree_name(version)),
    )?;

    let deb = deb::build(
        &deb::Inputs { version, binary: &binary, generated: &generated, unit: &unit, sample: &sample },
        &target_dir().join("dist-work/deb"),
        dist,
    )?;

    if image {
        let tag = crate::image::name(version);
        let context = target_dir().join("dist-work/image");
        crate::image::assemble(std::slice::from_ref(&binary), &context)?;
        run_command(&mut crate::image::build_command(&context, &[&tag]))?;
        let archive = dist.join(image_archive(version));
        run_command(
            Command::new("podman").args(["save", "--format", "oci-archive", "--output"]).arg(&archive).arg(&tag),
        )?;
        println!("xtask dist: image {tag} (podman) and {}", archive.display());
    }

    let mut names: Vec<String> = fs::read_dir(dist)?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "SHA256SUMS")
        .collect();
    names.sort();
    let sums = output_in(dist, Command::new("sha256sum").args(&names))?;
    fs::write(dist.join("SHA256SUMS"), sums)?;
    for name in names.iter().chain([&"SHA256SUMS".to_owned()]) {
        let size = fs::metadata(dist.join(name))?.len();
        println!("xtask dist: {} ({size} bytes)", dist.join(name).display());
    }
    Ok(Artifacts { version: version.to_owned(), deb })
}

/// Run a cargo build with its stderr passed through and kept; fail if it fails.
fn build_streaming(cmd: &mut Command) -> Result<String> {
    let mut child = cmd
        .current_dir(workspace_root())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {}", crate::util::describe(cmd)))?;
    let mut kept = String::new();
    if let Some(stderr) = child.stderr.take() {
        for line in io::BufRead::lines(io::BufReader::new(stderr)) {
            let line = line.context("reading cargo's output")?;
            eprintln!("{line}");
            kept.push_str(&line);
            kept.push('\n');
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("{} failed ({status})", crate::util::describe(cmd));
    }
    Ok(kept)
}

/// The man pages and completions, as the binary itself generates them.
pub struct Generated {
    /// `man/man1/*.1` and `man/man5/*.5`, sorted.
    pub man_pages: Vec<PathBuf>,
    pub bash: PathBuf,
    pub zsh: PathBuf,
    pub fish: PathBuf,
}

/// Run the binary's hidden generators into `tree`: `man/man1/`, `man/man5/`, `completions/`.
fn generate(binary: &Path, tree: &Path) -> Result<Generated> {
    let man = tree.join("man/man1");
    run_command(Command::new(binary).arg("man").arg(&man).stdout(std::process::Stdio::null()))?;
    // The configuration's page (`gpreempt-agent.toml.5`) goes to man5, as man(1) looks for it.
    let mut man_pages = Vec::new();
    for page in fs::read_dir(&man)?.map(|e| e.map(|e| e.path())).collect::<io::Result<Vec<_>>>()? {
        let section = page.extension().map(|e| e.to_string_lossy().into_owned()).unwrap_or_default();
        if section == "1" {
            man_pages.push(page);
            continue;
        }
        let dir = tree.join(format!("man/man{section}"));
        fs::create_dir_all(&dir)?;
        let moved = dir.join(page.file_name().context("a man page without a name")?);
        fs::rename(&page, &moved)?;
        man_pages.push(moved);
    }
    man_pages.sort();
    let completions = tree.join("completions");
    fs::create_dir_all(&completions)?;
    let script = |shell: &str, name: &str| -> Result<PathBuf> {
        let path = completions.join(name);
        fs::write(&path, output(Command::new(binary).args(["completions", shell]))?)?;
        Ok(path)
    };
    Ok(Generated {
        bash: script("bash", "gpreempt.bash")?,
        zsh: script("zsh", "_gpreempt")?,
        fish: script("fish", "gpreempt.fish")?,
        man_pages,
    })
}

/// Fail unless `binary` is static: no program interpreter, no shared object needed, and none of
/// [`NEEDS_SHARED_GLIBC`] linked in.
pub fn check_static(binary: &Path) -> Result<()> {
    let headers = output(Command::new("readelf").args(["--program-headers", "--dynamic", "--wide"]).arg(binary))
        .context("reading the ELF headers (readelf, from binutils)")?;
    let needs = dynamic_needs(&headers);
    if !needs.is_empty() {
        bail!(
            "{} is not static: it needs {} (was the crt-static flag overridden? RUSTFLAGS and \
             .cargo/config rustflags win over it)",
            binary.display(),
            needs.join(", ")
        );
    }
    let symbols = output(Command::new("nm").arg("--defined-only").arg(binary)).context("listing the symbols (nm)")?;
    let linked = shared_glibc_symbols(&symbols);
    if !linked.is_empty() {
        bail!(
            "{} links {} from the static glibc, which need the build machine's shared glibc at run time \
             (NSS, iconv): use an IP address / numeric id instead, or find the dependency that calls it",
            binary.display(),
            linked.join(", ")
        );
    }
    Ok(())
}

/// The [`NEEDS_SHARED_GLIBC`] entry points defined in `nm --defined-only` output.
fn shared_glibc_symbols(nm: &str) -> Vec<String> {
    let mut found: Vec<String> = nm
        .lines()
        .filter_map(|line| line.split_whitespace().nth(2))
        // Versioned or weak aliases print as `getpwnam@@GLIBC_2.2.5` in some builds.
        .map(|name| name.split('@').next().unwrap_or(name))
        .filter(|name| NEEDS_SHARED_GLIBC.contains(name))
        .map(str::to_owned)
        .collect();
    found.sort();
    found.dedup();
    found
}

fn remove_dir(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e).with_context(|| format!("removing {}", dir.display())),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nss_and_dlopen_entry_points_are_found_in_the_symbols() {
        let nm = "\
0000000000401000 T main
0000000000412340 T getaddrinfo
0000000000412340 W getpwnam@@GLIBC_2.2.5
0000000000412340 W dlopen
0000000000412340 t getaddrinfo
";
        assert_eq!(shared_glibc_symbols(nm), ["getaddrinfo", "getpwnam"]);
        assert_eq!(shared_glibc_symbols("0000000000401000 T main\n"), Vec::<String>::new());
    }
}
