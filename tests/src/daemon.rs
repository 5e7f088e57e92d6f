//! A background process a test talks to through its log (the agent, Prometheus): its stderr lines
//! collected on a thread, waited for by content ([`Lines`], also a container's log); killed on drop.

use std::{
    process::{Child, Command, ExitStatus, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

use crate::stderr_lines;

/// A child whose stderr lines are collected on a thread.
pub struct Daemon {
    child: Child,
    log: Lines,
}

/// Lines a program writes (its stderr, its container's log), as they come over a channel, waited
/// for by content; the lines seen are kept for the error that says what came instead.
pub struct Lines {
    name: &'static str,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Daemon {
    pub fn spawn(name: &'static str, command: &mut Command) -> Result<Self> {
        let mut child = command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().context(name)?;
        let lines = stderr_lines(child.stderr.take().context("no stderr")?, name);
        Ok(Self { child, log: Lines::new(name, lines) })
    }

    /// See [`Lines::wait_lines`].
    pub fn wait_lines(&mut self, needles: &[&str], wait: Duration) -> Result<Vec<String>> {
        self.log.wait_lines(needles, wait)
    }

    /// See [`Lines::wait_line`].
    pub fn wait_line(&mut self, needle: &str, wait: Duration) -> Result<String> {
        self.log.wait_line(needle, wait)
    }

    /// See [`Lines::next_line`].
    pub fn next_line(&mut self, wait: Duration) -> Option<String> {
        self.log.next_line(wait)
    }

    pub fn signal(&self, signal: Signal) -> Result<()> {
        Ok(kill(Pid::from_raw(self.child.id() as i32), signal)?)
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Wait for it to exit.
    pub fn wait(&mut self) -> Result<ExitStatus> {
        Ok(self.child.wait()?)
    }
}

impl Lines {
    pub fn new(name: &'static str, lines: mpsc::Receiver<String>) -> Self {
        Self { name, lines, seen: Vec::new() }
    }

    /// For each of `needles`, the first new line containing every whitespace-separated
    /// word of it (`msg="policy stopped" policy=a` takes the message and the field), in whatever
    /// order they come (lines of the policy threads interleave with the main loop's), within
    /// `wait`.
    pub fn wait_lines(&mut self, needles: &[&str], wait: Duration) -> Result<Vec<String>> {
        let deadline = Instant::now() + wait;
        let mut found: Vec<Option<String>> = vec![None; needles.len()];
        while found.iter().any(Option::is_none) {
            let left = deadline.checked_duration_since(Instant::now()).unwrap_or_default();
            let Ok(line) = self.lines.recv_timeout(left) else {
                bail!("{} printed no lines with {needles:?} within {wait:?}: {:?}", self.name, self.seen)
            };
            self.seen.push(line.clone());
            if let Some(i) = (0..needles.len())
                .find(|&i| found[i].is_none() && needles[i].split_whitespace().all(|w| line.contains(w)))
            {
                found[i] = Some(line);
            }
        }
        Ok(found.into_iter().flatten().collect())
    }

    /// The first new line containing `needle`, within `wait`.
    pub fn wait_line(&mut self, needle: &str, wait: Duration) -> Result<String> {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.checked_duration_since(Instant::now()).unwrap_or_default();
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return Ok(line);
                    }
                }
                Err(_) => bail!("{} printed no line with {needle:?} within {wait:?}: {:?}", self.name, self.seen),
            }
        }
    }

    /// The next line within `wait` (kept with the lines seen); None when none came.
    pub fn next_line(&mut self, wait: Duration) -> Option<String> {
        let line = self.lines.recv_timeout(wait).ok()?;
        self.seen.push(line.clone());
        Some(line)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
