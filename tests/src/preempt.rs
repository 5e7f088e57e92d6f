//! `gpreempt preempt` run over a selector, and its JSON report read back.

use std::{path::Path, process::Command};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::binary;

/// One target of the report: its pid, and per cycle (queues suspended, queues resumed, ok).
pub type Cycles = (u64, Vec<(i64, i64, bool)>);

/// `gpreempt preempt --no-trace --offline SELECTOR --iterations N --hold 20ms --gap 20ms`, its
/// report written to `json`: the report, and each target's [`Cycles`].
pub fn cycles(selector: &str, iterations: u32, json: &Path) -> Result<(Value, Vec<Cycles>)> {
    let out = Command::new(binary("gpreempt")?)
        .args(["preempt", "--no-trace", "--offline", selector, "--iterations", &iterations.to_string()])
        .args(["--hold", "20ms", "--gap", "20ms", "--output"])
        .arg(json)
        .output()?;
    if !out.status.success() {
        bail!("gpreempt preempt failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(json)?)?;
    let targets = doc["targets"].as_array().context("no targets")?;
    let cycles = targets
        .iter()
        .map(|t| {
            let iterations = t["iterations"].as_array().map(Vec::as_slice).unwrap_or_default();
            let each = iterations
                .iter()
                .map(|i| (i["suspended"].as_i64().unwrap_or(-1), i["resumed"].as_i64().unwrap_or(-1), i["ok"] == true))
                .collect();
            (t["target"]["pid"].as_u64().unwrap_or(0), each)
        })
        .collect();
    Ok((doc, cycles))
}
