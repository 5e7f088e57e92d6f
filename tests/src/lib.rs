//! Shared helpers for gpreempt's VM integration tests: locating the binaries under test,
//! running the tracer in the background until it is attached, and reading its JSON Lines.
//!
//! These tests run as root inside a VM with the real amdgpu driver (`cargo xtask test`); they
//! are not part of the host `cargo test`.

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, ChildStdout, Command, Stdio},
    sync::mpsc,
    thread,
    time::Duration,
};

use anyhow::{Context, Result, bail};

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
        let stderr = child.stderr.take().context("no stderr")?;
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[gpreempt] {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdout = child.stdout.take();
        let mut tracer = Self { child, stdout, stderr_lines: rx, stderr: Vec::new() };
        loop {
            // Loading 55 programs in a TCG guest on a loaded 2-core host has taken over a minute.
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
