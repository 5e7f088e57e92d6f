//! `cargo xtask dist --check`: the package on an old userland. A Debian 11 (bullseye) root, glibc
//! 2.31, made once by debootstrap (`--variant=minbase`) in `target/dist-check/bullseye` and kept;
//! the package is installed there with dpkg, chrooted, and then:
//!
//! - the root's glibc is 2.31 (what is checked is the old userland, not the host's);
//! - dpkg lists every file of the package and the version of Cargo.toml;
//! - `gpreempt --version` runs, and `gpreempt doctor` answers as it should here: with no amdgpu
//!   loaded, exit status 1 and "amdgpu is not loaded" once; with amdgpu, no such line;
//! - bash (5.1) loads the completion script;
//! - the unit is installed and not enabled; the sample configuration has no live policy;
//! - `dpkg --purge` removes it all, so the next check starts from the same root.
//!
//! Each command runs in a private mount namespace (`unshare --mount`) where the host's /proc,
//! /sys and /dev are bound into the root, so nothing stays mounted when it ends, even on an error.
//!
//! `--guest` runs the same check in the 6.12 guest, once without amdgpu and once with it: the
//! guest boots on the host's root (read-only), so `xtask dist-guest-check` copies the bullseye
//! root into a tmpfs there and chroots into that copy.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use anyhow::{Context, Result, bail};
use clap::Args;

use super::{Artifacts, DistArgs, deb};
use crate::{
    util::{is_root, run as run_command, succeeds, target_dir},
    vm::{self, Kernel, VmArgs},
};

/// The Debian release checked, and its glibc.
const SUITE: &str = "bullseye";
const GLIBC: &str = "2.31";

pub fn run(artifacts: &Artifacts, args: &DistArgs) -> Result<()> {
    if !is_root() {
        bail!("cargo xtask dist --check needs root (debootstrap, chroot, mount): run it as root or with sudo -E");
    }
    let root = bullseye_root(&args.mirror)?;
    let report = check_in_root(&root, &artifacts.deb, &artifacts.version)?;
    println!("{report}xtask dist: the package installs and runs on {SUITE} (glibc {GLIBC}), chrooted on the host");
    if args.guest {
        for no_amdgpu in [true, false] {
            guest(&root, artifacts, no_amdgpu)?;
        }
    }
    Ok(())
}

/// The bullseye root, made by debootstrap the first time. debootstrap deletes its own
/// `debootstrap/` directory from the root only when it succeeds: a root that still has one was
/// interrupted and is made again.
fn bullseye_root(mirror: &str) -> Result<PathBuf> {
    let root = target_dir().join("dist-check").join(SUITE);
    let complete = root.join("etc/debian_version").exists() && !root.join("debootstrap").exists();
    if complete {
        return Ok(root);
    }
    if !succeeds("debootstrap", &["--version"]) {
        bail!(
            "debootstrap not found: `apt-get install debootstrap` (it makes the {SUITE} root the check installs into)"
        );
    }
    if root.exists() {
        eprintln!("xtask dist: {} is incomplete (an interrupted debootstrap): making it again", root.display());
        fs::remove_dir_all(&root).with_context(|| format!("removing {}", root.display()))?;
    }
    eprintln!("xtask dist: debootstrap {SUITE} from {mirror} into {} (once; about 2 minutes)…", root.display());
    run_command(Command::new("debootstrap").args(["--variant=minbase", SUITE]).arg(&root).arg(mirror))
        .with_context(|| format!("debootstrap {SUITE} failed: is {mirror} reachable? (--mirror names another)"))?;
    // The downloaded packages are most of the root; the guest copies the root into memory.
    for entry in fs::read_dir(root.join("var/cache/apt/archives"))?.flatten() {
        if entry.path().extension().is_some_and(|e| e == "deb") {
            fs::remove_file(entry.path())?;
        }
    }
    Ok(root)
}

/// `command` run chrooted in `root`, with the host's /proc, /sys and /dev bound in a private mount
/// namespace.
fn in_root(root: &Path, command: &[&str]) -> Result<Output> {
    let script = "set -e; r=\"$1\"; shift; \
                  mount --rbind /proc \"$r/proc\"; mount --rbind /sys \"$r/sys\"; mount --rbind /dev \"$r/dev\"; \
                  exec chroot \"$r\" \"$@\"";
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c", script, "sh"]).arg(root).args(command);
    // The root's programs must not see the host's toolchain paths or locale.
    cmd.env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin").env("LC_ALL", "C");
    cmd.output().with_context(|| format!("cannot run `unshare` to chroot into {}", root.display()))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `in_root`, which must exit 0; its stdout.
fn ok_in_root(root: &Path, command: &[&str]) -> Result<String> {
    let out = in_root(root, command)?;
    if !out.status.success() {
        bail!(
            "`{}` in {} failed ({}):\n{}{}",
            command.join(" "),
            root.display(),
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    Ok(text(&out.stdout))
}

/// Install, check, purge; the lines of the report.
pub fn check_in_root(root: &Path, deb_file: &Path, version: &str) -> Result<String> {
    let mut report = String::new();
    let mut say = |line: String| {
        report.push_str(&line);
        report.push('\n');
    };
    let glibc = ok_in_root(root, &["ldd", "--version"])?;
    let glibc = glibc.lines().next().unwrap_or_default().to_owned();
    if !glibc.ends_with(&format!(" {GLIBC}")) {
        bail!("{} has `{glibc}`, not glibc {GLIBC}: not the {SUITE} root this check is about", root.display());
    }
    say(format!("root: {} ({glibc})", root.display()));

    let name = deb_file.file_name().context("the package path has no file name")?;
    let inside = Path::new("/tmp").join(name);
    fs::copy(deb_file, root.join("tmp").join(name))
        .with_context(|| format!("copying {} into {}", deb_file.display(), root.display()))?;
    let inside = inside.to_str().context("the package name is not UTF-8")?;
    let installed = ok_in_root(root, &["dpkg", "-i", inside])?;
    say(format!("$ dpkg -i {inside}\n{}", installed.trim_end()));

    let said = ok_in_root(root, &["dpkg-query", "-W", "-f", "${Version} ${Status}", "gpreempt"])?;
    let expected = format!("{} install ok installed", deb::debian_version(version));
    if said != expected {
        bail!("dpkg-query says `{said}`, expected `{expected}`");
    }
    let listed = ok_in_root(root, &["dpkg", "-L", "gpreempt"])?;
    let installed = |section: &str| -> Result<Vec<String>> {
        Ok(fs::read_dir(root.join(format!("usr/share/man/man{section}")))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("gpreempt"))
            .map(|n| n.trim_end_matches(".gz").to_owned())
            .collect())
    };
    let pages = installed("1")?;
    let config_pages = installed("5")?;
    let all_pages: Vec<String> = pages.iter().chain(&config_pages).cloned().collect();
    for (file, _) in deb::files(&all_pages, &deb::doc_files()?) {
        if !listed.lines().any(|l| l == format!("/{file}")) {
            bail!("dpkg -L gpreempt does not list /{file}:\n{listed}");
        }
    }
    // One page per command a user runs (gpreempt/src/commands/generate.rs), and the config's.
    if pages.len() != 10 {
        bail!("{} man pages installed, expected 10 (gpreempt and 9 commands): {pages:?}", pages.len());
    }
    if config_pages != ["gpreempt-agent.toml.5"] {
        bail!("section 5 holds {config_pages:?}, expected gpreempt-agent.toml.5");
    }
    say(format!("dpkg: gpreempt {expected}; {} files, {} man pages", listed.lines().count(), pages.len()));

    let said = ok_in_root(root, &["gpreempt", "--version"])?;
    if said.trim() != format!("gpreempt {version}") {
        bail!("`gpreempt --version` says `{}`", said.trim());
    }
    say(format!("$ gpreempt --version\n{}", said.trim()));

    let doctor = in_root(root, &["gpreempt", "doctor"])?;
    let stdout = text(&doctor.stdout);
    let stderr = text(&doctor.stderr);
    let code = doctor.status.code().map_or_else(|| doctor.status.to_string(), |c| c.to_string());
    say(format!("$ gpreempt doctor   # exit status {code}\n{}{}", stdout.trim_end(), {
        if stderr.is_empty() { String::new() } else { format!("\n{}", stderr.trim_end()) }
    }));
    check_doctor(Path::new("/dev/kfd").exists(), doctor.status.code(), &stdout, &stderr)?;

    let completion =
        ok_in_root(root, &["bash", "-c", ". /usr/share/bash-completion/completions/gpreempt && complete -p gpreempt"])?;
    if !completion.contains("-F _gpreempt") || !completion.trim_end().ends_with(" gpreempt") {
        bail!("bash did not load the gpreempt completion: `{}`", completion.trim());
    }
    say(format!("bash completion: {}", completion.trim()));

    let unit = root.join(deb::UNIT_PATH);
    if !unit.exists() {
        bail!("{} is not installed", unit.display());
    }
    let enabled = root.join("etc/systemd/system/multi-user.target.wants/gpreempt-agent.service");
    if enabled.symlink_metadata().is_ok() {
        bail!("the package enabled the agent ({} exists)", enabled.display());
    }
    let config = fs::read_to_string(root.join(deb::CONFIG_PATH)).context("the sample configuration")?;
    if config.lines().any(|l| l.trim_start().starts_with("[[policy]]")) {
        bail!("/{} has a live [[policy]]:\n{config}", deb::CONFIG_PATH);
    }
    say(format!("/{} installed, not enabled; /{} has no live policy", deb::UNIT_PATH, deb::CONFIG_PATH));

    let purged = ok_in_root(root, &["dpkg", "--purge", "gpreempt"])?;
    let _ = fs::remove_file(root.join("tmp").join(name));
    for left in [deb::BINARY_PATH, deb::CONFIG_PATH, deb::UNIT_PATH] {
        if root.join(left).exists() {
            bail!("/{left} is still there after dpkg --purge");
        }
    }
    say(format!("$ dpkg --purge gpreempt\n{}", purged.trim_end()));
    Ok(report)
}

/// What `gpreempt doctor` must answer: without amdgpu, exit status 1 and "amdgpu is not loaded"
/// once (and the one failed check on stderr); with it, never that line, and a verdict (0 or 1),
/// not a crash.
fn check_doctor(kfd: bool, code: Option<i32>, stdout: &str, stderr: &str) -> Result<()> {
    let not_loaded = stdout.matches("amdgpu is not loaded").count();
    if !stdout.lines().any(|l| l.starts_with("info  kernel ")) {
        bail!("gpreempt doctor printed no kernel line:\n{stdout}{stderr}");
    }
    if kfd {
        if not_loaded != 0 || !matches!(code, Some(0 | 1)) {
            bail!(
                "with /dev/kfd, gpreempt doctor exited {code:?} and said \"amdgpu is not loaded\" {not_loaded} time(s)"
            );
        }
    } else if code != Some(1) || not_loaded != 1 || stderr != "gpreempt: error: 1 check(s) failed\n" {
        bail!(
            "without amdgpu, gpreempt doctor must exit 1 saying \"amdgpu is not loaded\" once and fail that check \
             alone; it exited {code:?}, said it {not_loaded} time(s), stderr `{}`",
            stderr.trim()
        );
    }
    Ok(())
}

/// `xtask dist-guest-check`: the guest half of `--guest`.
#[derive(Args, Debug)]
pub struct GuestArgs {
    /// The bullseye root on the host (read-only in the guest).
    #[arg(long)]
    pub root: PathBuf,
    #[arg(long)]
    pub deb: PathBuf,
    #[arg(long)]
    pub version: String,
    /// The guest's writable directory: a tmpfs is mounted in it for the root's copy, and the
    /// report is written there (`dist-check.log`).
    #[arg(long)]
    pub out: PathBuf,
    /// With amdgpu loaded: also load this image archive into podman and run the agent from it.
    #[arg(long)]
    pub image: Option<PathBuf>,
}

const GUEST_REPORT: &str = "dist-check.log";

/// Boot the 6.12 guest and run the check there.
fn guest(root: &Path, artifacts: &Artifacts, no_amdgpu: bool) -> Result<()> {
    let xtask = std::env::current_exe().context("locating the xtask binary")?;
    let kernel = Kernel::V6_12;
    let out = vm::out_dir(kernel);
    let mut command = format!(
        "{} dist-guest-check --root {} --deb {} --version {} --out \"$GPREEMPT_VM_OUT\"",
        vm::shell_quote(&xtask.to_string_lossy()),
        vm::shell_quote(&root.to_string_lossy()),
        vm::shell_quote(&artifacts.deb.to_string_lossy()),
        vm::shell_quote(&artifacts.version),
    );
    let archive = super::dist_dir().join(super::image_archive(&artifacts.version));
    if !no_amdgpu && archive.exists() {
        command.push_str(&format!(" --image {}", vm::shell_quote(&archive.to_string_lossy())));
    }
    let args = VmArgs {
        kernel,
        timeout: 900,
        memory: "2G".to_owned(),
        cpus: 2,
        no_amdgpu,
        module: None,
        audit_text_pokes: false,
        command: vec![command],
    };
    let status = vm::run(&args)?;
    let report = fs::read_to_string(out.join(GUEST_REPORT)).unwrap_or_else(|e| format!("(no report: {e})\n"));
    let amdgpu = if no_amdgpu { "without amdgpu" } else { "with amdgpu loaded" };
    println!("--- guest {} ({amdgpu}) ---\n{report}", kernel.name());
    if status != 0 {
        bail!("the check in the {} guest ({amdgpu}) failed (status {status}); its report is above", kernel.name());
    }
    println!(
        "xtask dist: the package installs and runs on {SUITE}, chrooted in the {} guest ({amdgpu})",
        kernel.name()
    );
    Ok(())
}

/// In the guest: the root made writable (the shared root is read-only), checked there; the report
/// written to the out directory.
pub fn guest_main(args: &GuestArgs) -> Result<()> {
    let scratch = args.out.join(SUITE);
    fs::create_dir_all(&scratch)?;
    run_command(Command::new("mount").args(["-t", "tmpfs", "-o", "size=1G", "tmpfs"]).arg(&scratch))?;
    let result = writable_root(&args.root, &scratch).and_then(|root| check_in_root(&root, &args.deb, &args.version));
    for mount in [scratch.join("merged"), scratch] {
        let _ = Command::new("umount").arg(&mount).status();
    }
    let result = match (result, &args.image) {
        (Ok(report), Some(archive)) => match image_check(archive, &args.version) {
            Ok(more) => Ok(report + &more),
            Err(e) => Err(e.context(format!("the chroot check passed:\n{report}"))),
        },
        (result, _) => result,
    };
    let report = match &result {
        Ok(report) => report.clone(),
        Err(e) => format!("FAILED: {e:#}\n"),
    };
    fs::write(args.out.join(GUEST_REPORT), &report)?;
    result.map(|_| ())
}

/// `root` writable under `scratch` (a tmpfs): an overlay with `root` as its lower layer, which
/// copies nothing but what dpkg changes; a copy where overlayfs refuses the shared filesystem.
fn writable_root(root: &Path, scratch: &Path) -> Result<PathBuf> {
    let [upper, work, merged] = ["upper", "work", "merged"].map(|d| scratch.join(d));
    for dir in [&upper, &work, &merged] {
        fs::create_dir_all(dir)?;
    }
    let options = format!("lowerdir={},upperdir={},workdir={}", root.display(), upper.display(), work.display());
    let overlay = Command::new("mount").args(["-t", "overlay", "overlay", "-o", &options]).arg(&merged).status();
    if overlay.is_ok_and(|s| s.success()) {
        return Ok(merged);
    }
    eprintln!("xtask dist: no overlay on {}: copying it", root.display());
    let copy = scratch.join("copy");
    fs::create_dir_all(&copy)?;
    run_command(Command::new("cp").arg("-a").arg(root.join(".")).arg(&copy))?;
    Ok(copy)
}

/// In the guest, with amdgpu: the release image runs the agent with the capabilities of
/// `gpreempt doctor`'s agent-needs (gpreempt/tests/deploy.rs holds the list below to it), the host
/// pid namespace, a read-only root and the host paths it reads, and its metrics endpoint answers
/// with this version's `gpreempt_build_info`.
fn image_check(archive: &Path, version: &str) -> Result<String> {
    let graphroot = "/var/lib/containers";
    let mounts = fs::read_to_string("/proc/self/mounts")?;
    if !mounts.lines().any(|l| l.split_whitespace().nth(1) == Some(graphroot)) {
        // The guest's root is the host's, read-only: podman's storage goes on a tmpfs.
        run_command(Command::new("mount").args(["-t", "tmpfs", "-o", "size=512m", "tmpfs", graphroot]))
            .with_context(|| format!("mounting a tmpfs on {graphroot} (`cargo xtask setup` creates it)"))?;
    }
    let podman = |args: &[&str]| -> Result<String> {
        let out = Command::new("podman").args(args).output().context("running podman (`cargo xtask setup`)")?;
        if !out.status.success() {
            bail!("podman {} failed ({}): {}", args.join(" "), out.status, text(&out.stderr).trim());
        }
        Ok(text(&out.stdout))
    };
    let archive = archive.to_str().context("the image archive path is not UTF-8")?;
    let loaded = podman(&["load", "--input", archive])?;
    let tag = crate::image::name(version);
    podman(&["image", "exists", &tag])?;
    // Debian's kernels refuse perf_event_open to CAP_PERFMON alone above 2 (docs/install.md).
    fs::write("/proc/sys/kernel/perf_event_paranoid", "2").context("setting kernel.perf_event_paranoid=2")?;
    let name = "gpreempt-dist-check";
    let _ = podman(&["rm", "--force", "--time", "0", name]);
    let mut run = vec!["run", "--detach", "--name", name, "--pid", "host", "--network", "host", "--user", "0"];
    run.extend(["--cap-drop", "ALL", "--cap-add", "BPF,PERFMON,SYSLOG,SYS_PTRACE,SYS_NICE,IPC_LOCK"]);
    run.extend(["--security-opt", "no-new-privileges", "--security-opt", "seccomp=unconfined", "--read-only"]);
    run.extend(["--volume", "/sys/kernel/btf:/sys/kernel/btf:ro", "--volume", "/sys/class/kfd:/sys/class/kfd:ro"]);
    run.extend(["--volume", "/sys/devices/virtual/kfd:/sys/devices/virtual/kfd:ro", "--device", "/dev/kfd"]);
    run.extend(["--env", "NODE_NAME=vm", &tag, "agent", "--metrics-addr", "127.0.0.1:9464"]);
    podman(&run)?;
    let result = scrape_until_up("127.0.0.1:9464", std::time::Duration::from_secs(240));
    let logs = Command::new("podman").args(["logs", name]).output().map(|o| text(&o.stderr)).unwrap_or_default();
    let _ = podman(&["rm", "--force", "--time", "0", name]);
    let metrics = result.with_context(|| format!("the agent in {tag} did not serve /metrics; its log:\n{logs}"))?;
    let build_info = format!("gpreempt_build_info{{hostname=\"vm\",version=\"{version}\"}} 1");
    if !metrics.lines().any(|l| l == build_info) {
        bail!("{tag}'s /metrics has no `{build_info}`:\n{metrics}");
    }
    Ok(format!(
        "$ podman load --input {archive}\n{}\n$ podman run … {tag} agent   # with the agent-needs capabilities\n\
         /metrics: {build_info} ({} lines)\n",
        loaded.trim(),
        metrics.lines().count()
    ))
}

/// GET /metrics from `addr` until it answers 200 or `wait` passes (the agent attaches its probes
/// first: tens of seconds under software emulation).
fn scrape_until_up(addr: &str, wait: std::time::Duration) -> Result<String> {
    use std::io::{Read, Write};
    let deadline = std::time::Instant::now() + wait;
    loop {
        let attempt = (|| -> std::io::Result<String> {
            let mut s = std::net::TcpStream::connect(addr)?;
            s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
            let mut raw = String::new();
            s.read_to_string(&mut raw)?;
            Ok(raw)
        })();
        match attempt {
            Ok(raw) if raw.starts_with("HTTP/1.1 200") => {
                return Ok(raw.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default());
            }
            Ok(raw) => bail!("{addr} answered `{}`", raw.lines().next().unwrap_or_default()),
            Err(e) if std::time::Instant::now() > deadline => bail!("{addr}: {e} after {wait:?}"),
            Err(_) => std::thread::sleep(std::time::Duration::from_secs(1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOT_LOADED: &str = "info  kernel                       Linux 6.12.0\n\
FAIL  amdgpu                       amdgpu is not loaded (no /dev/kfd, no KFD function in the kernel, no /sys/module/amdgpu): the checks of the driver are skipped\n\
                                   → `modprobe amdgpu` on a host with an AMD GPU, then run `gpreempt doctor` again\n";

    #[test]
    fn doctor_without_amdgpu_must_say_so_once_and_exit_1() {
        let failed = "gpreempt: error: 1 check(s) failed\n";
        check_doctor(false, Some(1), NOT_LOADED, failed).unwrap();
        assert!(check_doctor(false, Some(0), NOT_LOADED, "").is_err());
        let twice = format!("{NOT_LOADED}FAIL  debug-trap                   amdgpu is not loaded\n");
        assert!(check_doctor(false, Some(1), &twice, failed).is_err());
        assert!(check_doctor(false, Some(1), NOT_LOADED, "gpreempt: error: 2 check(s) failed\n").is_err());
        // A panic (101) is no answer.
        assert!(check_doctor(false, Some(101), "", "thread 'main' panicked").is_err());
    }

    #[test]
    fn doctor_with_amdgpu_must_not_say_it_is_missing() {
        let loaded = "info  kernel                       Linux 6.12.0\nok    amdgpu                       loaded\n";
        check_doctor(true, Some(0), loaded, "").unwrap();
        check_doctor(true, Some(1), loaded, "gpreempt: error: 1 check(s) failed\n").unwrap();
        assert!(check_doctor(true, Some(1), NOT_LOADED, "").is_err());
        assert!(check_doctor(true, Some(101), loaded, "").is_err());
    }
}
