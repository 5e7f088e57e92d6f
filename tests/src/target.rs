//! The `rt-target` helper (a runtime-enabled KFD process) running in the background, and what
//! /proc says about a process, for the controller tests.

use std::{
    fs,
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use gpreempt::host::procinfo;

use crate::binary;

pub struct RtTarget {
    child: Child,
    events: mpsc::Receiver<serde_json::Value>,
}

impl RtTarget {
    /// Start `rt-target ARGS` and wait for its RUNTIME_ENABLE unless `--delay-ms` defers it.
    pub fn start(args: &[&str]) -> Result<Self> {
        let mut child = Command::new(binary("rt-target")?)
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .context("spawning rt-target")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, events) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                eprintln!("[rt-target] {line}");
                let Ok(v) = serde_json::from_str(&line) else { break };
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        let target = Self { child, events };
        Ok(target)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next event named `name` (earlier other events are skipped).
    pub fn wait_for(&self, name: &str, timeout: Duration) -> Result<serde_json::Value> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.events.recv_timeout(left) {
                Ok(v) if v["event"] == name => return Ok(v),
                Ok(_) => {}
                Err(_) => bail!("rt-target did not report `{name}` within {timeout:?}"),
            }
        }
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) -> Result<()> {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid() as i32), signal)?;
        Ok(())
    }

    /// Wait for it to exit; its exit code.
    pub fn wait(mut self) -> Result<i32> {
        let status = self.child.wait()?;
        status.code().context("rt-target was killed by a signal")
    }
}

impl Drop for RtTarget {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn status_number(pid: u32, key: &str) -> Result<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    procinfo::status_number(&status, key).with_context(|| format!("no {key} in /proc/{pid}/status"))
}

/// The process tracing `pid` (the Tgid of its `TracerPid:`, which is the tracing thread), or 0.
pub fn tracer_pid(pid: u32) -> Result<u32> {
    match status_number(pid, "TracerPid")? {
        0 => Ok(0),
        tid => status_number(tid, "Tgid"),
    }
}

/// The state letter of /proc/<pid>/stat (R, S, T, t, Z …).
pub fn state(pid: u32) -> Result<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rfind(')').context("malformed stat")?;
    stat[after + 1..].trim_start().chars().next().context("no state")
}

/// Poll `f` every 20 ms until it is true or `timeout` passes.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        thread::sleep(Duration::from_millis(20));
    }
    f()
}
