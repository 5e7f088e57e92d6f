//! A real Prometheus server (Debian's, installed by `cargo xtask setup`) scraping one target
//! every second, and its HTTP query API.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::stderr_lines;

/// A plain HTTP/1.0 GET (the agent and Prometheus both answer it without chunking).
pub fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).context("no status line")?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Ok((status, body))
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Prometheus's instant query at `addr`: each result's (labels, value).
pub fn query_at(addr: SocketAddr, promql: &str) -> Result<Vec<(Value, f64)>> {
    let (status, body) = http_get(addr, &format!("/api/v1/query?query={}", percent_encode(promql)))?;
    let v: Value = serde_json::from_str(&body).with_context(|| format!("{status}: {body}"))?;
    if v["status"] != "success" {
        bail!("query {promql}: {body}");
    }
    v["data"]["result"]
        .as_array()
        .context("no result")?
        .iter()
        .map(|r| {
            let value = r["value"][1].as_str().context("no value")?.parse::<f64>()?;
            Ok((r["metric"].clone(), value))
        })
        .collect()
}

/// The value of the series of `family` whose labels include every one of `labels`
/// (`state="active"`), as the agent's exposition prints it (0 when absent).
pub fn series(text: &str, family: &str, labels: &[&str]) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")) && labels.iter().all(|want| l.contains(want)))
        .find_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// A loopback port nobody listens on now.
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub struct Prometheus {
    pub addr: SocketAddr,
    child: Child,
    _lines: mpsc::Receiver<String>,
}

impl Prometheus {
    /// Prometheus scraping `target` every second, its data under `dir`; returned once ready.
    pub fn start(dir: &Path, target: SocketAddr) -> Result<Self> {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: gpreempt\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )?;
        let mut child = Command::new("/usr/bin/prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting /usr/bin/prometheus (cargo xtask setup installs it)")?;
        let lines = stderr_lines(child.stderr.take().context("no stderr")?, "prometheus");
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let left = deadline.checked_duration_since(Instant::now()).unwrap_or_default();
            match lines.recv_timeout(left) {
                Ok(line) if line.contains("Server is ready to receive web requests") => break,
                Ok(_) => {}
                Err(_) => bail!("Prometheus was not ready within 180 s"),
            }
        }
        Ok(Self { addr, child, _lines: lines })
    }

    /// An instant query: each result's (labels, value).
    pub fn query(&self, promql: &str) -> Result<Vec<(Value, f64)>> {
        query_at(self.addr, promql)
    }

    /// Poll `promql` until its results, as sorted (`label` value, value) pairs, equal `expected`
    /// or 120 s pass; returns the last results either way, for the caller's exact assertion.
    pub fn settle(&self, promql: &str, label: &str, expected: &[(&str, f64)]) -> Vec<(String, f64)> {
        let deadline = Instant::now() + Duration::from_secs(120);
        let want: Vec<(String, f64)> = expected.iter().map(|(l, v)| ((*l).to_owned(), *v)).collect();
        loop {
            let mut got: Vec<(String, f64)> = self
                .query(promql)
                .unwrap_or_default()
                .into_iter()
                .map(|(m, v)| (m[label].as_str().unwrap_or("").to_owned(), v))
                .collect();
            got.sort_by(|a, b| a.0.cmp(&b.0));
            if got == want || Instant::now() > deadline {
                return got;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), nix::sys::signal::SIGTERM);
        let _ = self.child.wait();
    }
}
