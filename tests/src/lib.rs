//! Shared helpers for gpreempt's VM integration tests: locating the binaries under test,
//! running the tracer in the background until it is attached, and reading its JSON Lines.
//!
//! These tests run as root inside a VM with the real amdgpu driver (`cargo xtask test`); they
//! are not part of the host `cargo test`.

use std::{
    io::{BufRead, BufReader, Write},
    path::PathBuf,
    process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, Stdio},
    sync::mpsc,
    thread,
    time::Duration,
};

use anyhow::{Context, Result, bail};

pub mod agent;
pub mod containerd;
pub mod controller;
pub mod daemon;
pub mod emu_workload;
pub mod http_service;
pub mod kfd_abi;
pub mod kubelet;
pub mod podman;
pub mod preempt;
pub mod prometheus;
pub mod render_nodes;
pub mod schedule;
pub mod target;

/// A scratch directory for one test binary's run, `gpreempt-NAME-PID` under the temp dir.
pub fn scratch(name: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("gpreempt-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// A cgroup v2 directory named as Docker names a container's scope (`docker-<64 hex>.scope`),
/// cgroup2 mounted at /sys/fs/cgroup first if the guest has not: a process moved into it is "in
/// container" `id` for `gpreempt ps` and the selectors.
pub fn docker_cgroup(id: &str) -> PathBuf {
    assert_eq!(id.len(), 64, "Docker ids are 64 hex digits");
    if !std::path::Path::new("/sys/fs/cgroup/cgroup.procs").exists() {
        let ok = Command::new("mount").args(["-t", "cgroup2", "none", "/sys/fs/cgroup"]).status().unwrap();
        assert!(ok.success(), "cannot mount cgroup2 at /sys/fs/cgroup");
    }
    let cg = PathBuf::from(format!("/sys/fs/cgroup/docker-{id}.scope"));
    std::fs::create_dir_all(&cg).unwrap();
    cg
}

/// `key=value` of a structured log line (the agent's: values without spaces).
pub fn log_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// `target/<profile>/<name>` next to the running test binary (`target/<profile>/deps/…`).
pub fn binary(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let profile_dir =
        exe.parent().and_then(|deps| deps.parent()).context("test binary has no target/<profile> directory")?;
    let path = profile_dir.join(name);
    if !path.exists() {
        bail!("{} not built (cargo xtask test builds it)", path.display());
    }
    Ok(path)
}

/// A child's stderr, line by line, over a channel (each line also echoed as `[name] line`).
pub fn stderr_lines(stderr: ChildStderr, name: &'static str) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[{name}] {line}");
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// `gpreempt trace --json …` running in the background.
pub struct Tracer {
    child: Child,
    stdout: Option<ChildStdout>,
    stderr_lines: mpsc::Receiver<String>,
    /// stderr lines read so far (the attach report, missing probes, …).
    pub stderr: Vec<String>,
}

impl Tracer {
    /// Start the tracer and wait until it reports its probes attached.
    pub fn start(extra_args: &[&str]) -> Result<Self> {
        let mut child = Command::new(binary("gpreempt")?)
            .args(["trace", "--json"])
            .args(extra_args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawning gpreempt trace")?;
        let rx = stderr_lines(child.stderr.take().context("no stderr")?, "gpreempt");
        let stdout = child.stdout.take();
        let mut tracer = Self { child, stdout, stderr_lines: rx, stderr: Vec::new() };
        loop {
            // Loading every program in a TCG guest on a loaded 2-core host has taken over a minute.
            match tracer.stderr_lines.recv_timeout(Duration::from_secs(240)) {
                Ok(line) if line.contains("error") => bail!("gpreempt trace failed: {line}"),
                Ok(line) if line.contains(" probes to ") => {
                    tracer.stderr.push(line);
                    return Ok(tracer);
                }
                Ok(line) => tracer.stderr.push(line),
                Err(_) => bail!("gpreempt trace did not attach within 240 s"),
            }
        }
    }

    /// Host pid of the tracer (for signals).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Collect the stderr lines that arrive within `wait`.
    pub fn read_stderr(&mut self, wait: Duration) -> &[String] {
        let deadline = std::time::Instant::now() + wait;
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match self.stderr_lines.recv_timeout(left) {
                Ok(line) => self.stderr.push(line),
                Err(_) => break,
            }
        }
        &self.stderr
    }

    /// SIGINT the tracer (as Ctrl-C would), then return every JSON object it printed.
    pub fn stop(mut self) -> Result<Vec<serde_json::Value>> {
        // Give the ring buffer consumer a moment to see the last records before stopping.
        thread::sleep(Duration::from_millis(200));
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), nix::sys::signal::Signal::SIGINT)?;
        let stdout = self.stdout.take().context("no stdout")?;
        let mut objects = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            objects.push(serde_json::from_str(&line).with_context(|| format!("not JSON: {line}"))?);
        }
        let status = self.child.wait()?;
        if !status.success() {
            bail!("gpreempt trace exited with {status}");
        }
        Ok(objects)
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run the KFD client helper with `args`; returns (its pid, its JSON report).
pub fn kfd_client(args: &[&str]) -> Result<(u32, serde_json::Value)> {
    let out = Command::new(binary("kfd-client")?).args(args).output().context("running kfd-client")?;
    if !out.status.success() {
        bail!("kfd-client {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).context("kfd-client output is not JSON")?;
    let pid = report["pid"].as_u64().context("no pid in kfd-client report")? as u32;
    Ok((pid, report))
}

/// The events of one kind from one pid.
pub fn events_of<'a>(objects: &'a [serde_json::Value], pid: u32, kind: &str) -> Vec<&'a serde_json::Value> {
    objects.iter().filter(|o| o["event"] == kind && o["pid"] == pid).collect()
}

/// Wait (up to 2 min) until KFD released `pid`'s process: its sysfs directory is removed in
/// `kfd_process_wq_release`, which a kworker runs some time after the exit.
pub fn wait_kfd_released(pid: u32) -> Result<()> {
    let dir = PathBuf::from(format!("/sys/class/kfd/kfd/proc/{pid}"));
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while dir.exists() {
        if std::time::Instant::now() > deadline {
            bail!("{} still exists 2 min after the exit", dir.display());
        }
        thread::sleep(Duration::from_millis(100));
    }
    // The release continues after the directory is gone; let its records reach the tracer.
    thread::sleep(Duration::from_millis(500));
    Ok(())
}

/// Ends the calling test as **skipped**, saying why: writes `SKIPPED: <test>: <why>` to the
/// process's stdout directly (past libtest's output capture, so the line shows although libtest
/// then reports the test as passed) and returns from the test. `cargo xtask test` counts each
/// such line as skipped instead of passed (`xtask/src/test.rs`). Only for a test that cannot run
/// here at all; a kernel that must refuse something is asserted, not skipped.
#[macro_export]
macro_rules! skip {
    ($($why:tt)+) => {{
        fn here() {}
        let test = ::std::any::type_name_of_val(&here).trim_end_matches("::here");
        $crate::report_skip(test, &format!($($why)+));
        return;
    }};
}

/// The line behind [`skip!`].
/// A finished command's exit code and the last line of its stderr (where gpreempt's error line
/// is), with the whole stderr for the assertion's message.
pub fn exit_and_last_line(out: &std::process::Output) -> (Option<i32>, String, String) {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code(), last_line(&stderr).to_owned(), stderr)
}

/// The last line of `text` ("" for none).
pub fn last_line(text: &str) -> &str {
    text.trim_end().lines().last().unwrap_or("")
}

pub fn report_skip(test: &str, why: &str) {
    let mut out = std::io::stdout().lock();
    // Best effort: a test that cannot write to stdout still ends (and is then counted as passed).
    let _ = writeln!(out, "SKIPPED: {test}: {why}");
    let _ = out.flush();
}

/// `object[key]`, failing the test when the key is absent: `assert_eq!(field(o, "k"), &Value::Null)`
/// must not pass because `k` was renamed.
pub fn field<'a>(object: &'a serde_json::Value, key: &str) -> &'a serde_json::Value {
    match object.get(key) {
        Some(v) => v,
        None => panic!("no key {key:?} in {object}"),
    }
}

/// The kernel the VM booted (`6.1` or `6.12`, from `cargo xtask vm`).
pub fn vm_kernel() -> String {
    std::env::var("GPREEMPT_VM_KERNEL").unwrap_or_default()
}

/// Objects whose `event` is `kind` and whose `field` equals `value`.
pub fn objects_where<'a>(
    objects: &'a [serde_json::Value],
    kind: &str,
    field: &str,
    value: &serde_json::Value,
) -> Vec<&'a serde_json::Value> {
    objects.iter().filter(|o| o["event"] == kind && &o[field] == value).collect()
}

/// The closing summary object.
pub fn summary(objects: &[serde_json::Value]) -> Result<&serde_json::Value> {
    objects.iter().find(|o| o["event"] == "summary").context("no summary object")
}

/// A helper process driven line by line: one command on its stdin, one JSON object back on its
/// stdout (`emu-workload`). The first line it prints is kept as `hello`.
pub struct LineHelper {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    pub hello: serde_json::Value,
}

impl LineHelper {
    pub fn spawn(name: &str, args: &[&str]) -> Result<Self> {
        Self::spawn_with_env(name, args, &[])
    }

    /// [`LineHelper::spawn`] with extra environment variables (what a launcher would set).
    pub fn spawn_with_env(name: &str, args: &[&str], env: &[(&str, &str)]) -> Result<Self> {
        let mut child = Command::new(binary(name)?)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("spawning {name}"))?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().context("no stdout")?);
        let mut helper = Self { child, stdin, stdout, hello: serde_json::Value::Null };
        helper.hello = helper.recv().with_context(|| format!("{name} {args:?} did not start"))?;
        Ok(helper)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send one command without waiting for the reply (for commands that block in the driver).
    pub fn send(&mut self, line: &str) -> Result<()> {
        let stdin = self.stdin.as_mut().context("stdin already closed")?;
        writeln!(stdin, "{line}")?;
        stdin.flush()?;
        Ok(())
    }

    /// The next reply.
    pub fn recv(&mut self) -> Result<serde_json::Value> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("helper {} closed its output", self.child.id());
        }
        serde_json::from_str(&line).with_context(|| format!("not JSON: {line}"))
    }

    pub fn cmd(&mut self, line: &str) -> Result<serde_json::Value> {
        self.send(line)?;
        self.recv()
    }

    /// Close stdin (the helper exits without cleaning up) and wait for it.
    pub fn finish(mut self) -> Result<std::process::ExitStatus> {
        drop(self.stdin.take());
        Ok(self.child.wait()?)
    }
}

impl Drop for LineHelper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A sysfs file's text, exactly (no trimming).
pub fn read_sysfs(path: &str) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {path}"))
}

/// A number in decimal or `0x` hex (helper command lines).
pub fn parse_u64(s: &str) -> Result<u64, String> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).map_err(|e| e.to_string()),
        None => s.parse().map_err(|e: std::num::ParseIntError| e.to_string()),
    }
}

/// [`parse_u64`] that must fit 32 bits.
pub fn parse_u32(s: &str) -> Result<u32, String> {
    u32::try_from(parse_u64(s)?).map_err(|e| e.to_string())
}

/// The tracer's probe table resolved against this guest's `/proc/kallsyms`, KFD version and
/// release: what `trace` must attach and `doctor` must report, so no test hard-codes a probe count.
/// The version is None where `/dev/kfd` cannot be opened (7.x without a GPU: EINVAL), as in the
/// tracer and doctor themselves.
pub fn expected_probes() -> Result<Vec<gpreempt::trace::probes::ResolvedProbe>> {
    use gpreempt::trace::{probes, symbols::Kallsyms};
    let kallsyms = Kallsyms::load()?;
    let kfd = match gpreempt::kfd::Device::open().and_then(|d| d.version()) {
        Ok(v) => Some(v),
        Err(_) if kfd_needs_a_gpu() => None,
        Err(e) => return Err(e.into()),
    };
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
    Ok(probes::resolve(probes::PROBES, &kallsyms, kfd, Some(release.trim())))
}

/// Does opening `/dev/kfd` fail with EINVAL because the driver has no GPU? KFD ≥ 1.19 (Debian
/// 7.3.4) refuses to create a KFD process without a GPU node; 6.12.117 and older open it
/// (docs/kfd.md §1.4). With the real amdgpu on 7.x no KFD ioctl can be exercised: the tests that
/// need one are skipped there and run on the emulator instead.
pub fn kfd_needs_a_gpu() -> bool {
    matches!(
        gpreempt::kfd::Device::open(),
        Err(gpreempt::kfd::device::DeviceError::Open(e)) if e.raw_os_error() == Some(libc::EINVAL)
    )
}

/// Skip the calling test (counted as skipped) when `/dev/kfd` cannot be opened for want of a GPU
/// ([`kfd_needs_a_gpu`]): on 7.x with the real amdgpu.
#[macro_export]
macro_rules! skip_without_kfd_open {
    () => {
        if $crate::kfd_needs_a_gpu() {
            $crate::skip!(
                "open(/dev/kfd) fails with EINVAL: KFD >= 1.19 (7.x) creates no KFD process without a GPU; \
                 the emulator pass covers this path"
            );
        }
    };
}

/// A KFD emulator module parameter (`/sys/module/kfd_emu/parameters/<name>`).
pub fn emu_param(name: &str) -> Result<u64> {
    let text = read_sysfs(&format!("/sys/module/kfd_emu/parameters/{name}"))?;
    text.trim().parse().with_context(|| format!("parameter {name}: {text:?}"))
}

/// Sets an emulator module parameter for as long as it lives, then restores the old value (also
/// when a test panics).
pub struct EmuParam {
    name: &'static str,
    old: u64,
}

impl EmuParam {
    pub fn set(name: &'static str, value: u64) -> Result<Self> {
        let old = emu_param(name)?;
        std::fs::write(format!("/sys/module/kfd_emu/parameters/{name}"), value.to_string())
            .with_context(|| format!("setting {name}"))?;
        Ok(Self { name, old })
    }
}

impl Drop for EmuParam {
    fn drop(&mut self) {
        let _ = std::fs::write(format!("/sys/module/kfd_emu/parameters/{}", self.name), self.old.to_string());
    }
}

/// The KFD of a VM kernel without the debug trap, and what its `kfd_ioctl` answers for an ioctl
/// number past its command table (RUNTIME_ENABLE 0x25, DBG_TRAP 0x26): Debian 6.1.192 (KFD 1.11)
/// says ENOTTY, 5.10.223 (KFD 1.3) EINVAL (observed in the VM; docs/kfd.md §2.1). None on the
/// kernels with the debug trap.
pub fn without_debug_trap() -> Option<(gpreempt::kfd::KfdVersion, nix::errno::Errno)> {
    use gpreempt::kfd::KfdVersion;
    match vm_kernel().as_str() {
        "6.1" => Some((KfdVersion { major: 1, minor: 11 }, nix::errno::Errno::ENOTTY)),
        "5.10" => Some((KfdVersion { major: 1, minor: 3 }, nix::errno::Errno::EINVAL)),
        _ => None,
    }
}

/// What the library and the binary say on a kernel without the debug trap (docs/kfd.md §5 item 1).
pub fn no_debug_trap_message(version: gpreempt::kfd::KfdVersion) -> String {
    format!("the debug-trap API needs KFD ≥ 1.13 (Linux 6.5+ or amdgpu-dkms); this kernel has {version}")
}
