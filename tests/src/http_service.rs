//! An online HTTP service on the emulated GPU in a cgroup v2 directory of its own (`emu-workload
//! server --listen`), the load that drives it (`emu-workload request --url`) and health probes
//! and scrapes sent from the test itself: what the arrival path of `gpreempt schedule` watches.
//!
//! The service is moved into its cgroup by the shell it is exec'd from, before it creates its
//! listening socket: a socket keeps the cgroup it was created in, and the arrival probe's
//! `cgroup_skb` program sees only the segments to sockets of the cgroup it is attached to. The
//! load and the probes run in the test's own cgroup, so only the service's side of each
//! connection is seen.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::Duration,
};

use anyhow::{Context, Result, bail, ensure};
use gpreempt::host::cgroup::unified_mount;
use serde_json::Value;

use crate::binary;

/// A cgroup v2 directory of the test's, removed (empty by then) when dropped.
pub struct Cgroup(pub PathBuf);

impl Cgroup {
    /// `<cgroup2 mount>/gpreempt-<tag>-<pid>`, cgroup2 mounted at /sys/fs/cgroup first if the
    /// guest has no cgroup2 mount.
    pub fn new(tag: &str) -> Result<Self> {
        let mountinfo = || std::fs::read_to_string("/proc/self/mountinfo");
        let mount = match unified_mount(&mountinfo()?) {
            Some(m) => m,
            None => {
                let ok = Command::new("mount").args(["-t", "cgroup2", "none", "/sys/fs/cgroup"]).status()?;
                ensure!(ok.success(), "cannot mount cgroup2 at /sys/fs/cgroup");
                unified_mount(&mountinfo()?).context("cgroup2 mounted but not in mountinfo")?
            }
        };
        let dir = mount.join(format!("gpreempt-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Its processes are gone by now (a service is declared after its cgroup, so dropped first).
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// An HTTP service in `cgroup` (`emu-workload server --listen 127.0.0.1:0 ARGS…`, or any program
/// that prints the same hello): its hello line, its port.
pub struct HttpService {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    pub hello: Value,
    pub port: u16,
}

impl HttpService {
    pub fn start(cgroup: &Cgroup, args: &[&str]) -> Result<Self> {
        let args: Vec<&str> =
            ["server", "--listen", "127.0.0.1:0"].iter().copied().chain(args.iter().copied()).collect();
        Self::start_program(cgroup, &binary("emu-workload")?, &args)
    }

    /// `program ARGS…` exec'd in `cgroup`; its first line on stdout is a JSON hello with its
    /// `pid` (the one exec'd: no wrapper left between) and the `port` it listens on.
    pub fn start_program(cgroup: &Cgroup, program: &Path, args: &[&str]) -> Result<Self> {
        let mut child = Command::new("sh")
            .args(["-c", r#"echo $$ > "$1/cgroup.procs" && shift 2 && exec "$0" "$@""#])
            .arg(program)
            .arg(&cgroup.0)
            .arg("--")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("spawning the HTTP service {}", program.display()))?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().context("no stdout")?);
        let mut service = Self { child, stdin, stdout, hello: Value::Null, port: 0 };
        service.hello = service.recv().with_context(|| format!("{} {args:?} did not start", program.display()))?;
        service.port = service.hello["port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .with_context(|| format!("no port in {}", service.hello))?;
        ensure!(service.hello["pid"] == service.child.id(), "the shell exec'd the server: one pid ({})", service.hello);
        Ok(service)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn recv(&mut self) -> Result<Value> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("the HTTP service closed its output");
        }
        serde_json::from_str(&line).with_context(|| format!("not JSON: {line}"))
    }

    /// Its totals now (`stats`: requests, dispatches, connections, health, metrics).
    pub fn stats(&mut self) -> Result<Value> {
        writeln!(self.stdin.as_mut().context("stdin closed")?, "stats")?;
        self.recv()
    }
}

impl Drop for HttpService {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What `emu-workload request --url` printed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadResult {
    pub requests: u64,
    pub dispatches: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Health probes answered beside the requests.
    pub health: u64,
}

impl LoadResult {
    /// `requests=K dispatches=D p50_ms=… p99_ms=… max_ms=… health=H`.
    pub fn parse(line: &str) -> Result<Self> {
        let field = |name: &str| -> Result<f64> {
            let value = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
                .with_context(|| format!("no {name}= in {line:?}"))?;
            value.parse().with_context(|| format!("{name}={value:?} in {line:?}"))
        };
        Ok(Self {
            requests: field("requests")? as u64,
            dispatches: field("dispatches")? as u64,
            p50_ms: field("p50_ms")?,
            p99_ms: field("p99_ms")?,
            max_ms: field("max_ms")?,
            health: field("health")? as u64,
        })
    }
}

/// `emu-workload request --url URL --requests N --dispatches D --gap-us GAP`, with a health
/// probe every `health_every_ms` beside them; it must succeed.
pub fn load(
    url: &str,
    requests: u32,
    dispatches: u32,
    gap_us: u64,
    health_every_ms: Option<u64>,
) -> Result<LoadResult> {
    let mut command = Command::new(binary("emu-workload")?);
    command.args(["request", "--url", url]).args([
        "--requests",
        &requests.to_string(),
        "--dispatches",
        &dispatches.to_string(),
        "--gap-us",
        &gap_us.to_string(),
    ]);
    if let Some(ms) = health_every_ms {
        command.args(["--health-every-ms", &ms.to_string()]);
    }
    let out = command.output().context("running emu-workload request")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "emu-workload request {}: stderr {:?}, stdout {stdout:?}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    LoadResult::parse(stdout.trim())
}

/// One keep-alive connection to the service that sends what a prober and a scraper send.
pub struct Prober {
    conn: TcpStream,
    answers: BufReader<TcpStream>,
}

impl Prober {
    pub fn connect(port: u16) -> Result<Self> {
        let conn = TcpStream::connect(("127.0.0.1", port))?;
        conn.set_nodelay(true)?;
        // A missing answer fails the test instead of hanging it.
        conn.set_read_timeout(Some(Duration::from_secs(60)))?;
        Ok(Self { answers: BufReader::new(conn.try_clone()?), conn })
    }

    /// `GET path` in one write (one segment), its `200 OK` answer read whole.
    pub fn get(&mut self, path: &str) -> Result<()> {
        self.conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: probe\r\n\r\n").as_bytes())?;
        let mut status = String::new();
        self.answers.read_line(&mut status)?;
        ensure!(status.starts_with("HTTP/1.1 200 "), "GET {path}: {status:?}");
        let mut length = 0;
        loop {
            let mut header = String::new();
            self.answers.read_line(&mut header)?;
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some(v) = header.strip_prefix("Content-Length:") {
                length = v.trim().parse()?;
            }
        }
        let mut body = vec![0; length];
        self.answers.read_exact(&mut body)?;
        Ok(())
    }
}

/// The cgroup v2 directory `pid` is in (`/proc/PID/cgroup`'s `0::` line under the mount).
pub fn cgroup_of(pid: u32) -> Result<PathBuf> {
    Ok(gpreempt::host::cgroup::cgroup_dir(Path::new("/proc"), gpreempt::domain::HostPid(pid))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_load_line_is_parsed_with_its_health_probes() {
        let r =
            LoadResult::parse("requests=30 dispatches=60 p50_ms=36.125 p99_ms=52.000 max_ms=60.5 health=12").unwrap();
        assert_eq!(
            r,
            LoadResult { requests: 30, dispatches: 60, p50_ms: 36.125, p99_ms: 52.0, max_ms: 60.5, health: 12 }
        );
        assert!(LoadResult::parse("requests=30 dispatches=60").is_err());
    }
}
