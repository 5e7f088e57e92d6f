//! `cargo xtask fuzz`: run every cargo-fuzz target of `gpreempt/fuzz/` for a short time each.
//!
//! cargo-fuzz needs nightly (sanitizer flags); it is installed on first use rather than by
//! `cargo xtask setup`, which stays cheap. The fuzz crate is its own workspace, so the main
//! workspace never builds it. The eBPF object is not needed (`AYA_BUILD_SKIP=1`). Seed corpora:
//! the debugfs captures in `fixtures/debugfs-mi308x` and the kallsyms captures in the tracer's fixtures.

use std::{fs, path::PathBuf, process::Command};

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::util::{cargo, describe, run, succeeds, workspace_root};

/// Every target in `gpreempt/fuzz/fuzz_targets/`.
pub const TARGETS: [&str; 5] = ["decode_record", "debugfs", "kallsyms", "btf", "sysfs_proc"];

#[derive(Args, Debug)]
pub struct FuzzArgs {
    /// Seconds per target.
    #[arg(long, default_value_t = 30)]
    pub seconds: u64,
    /// Only this target (default: all of them).
    #[arg(long, value_parser = TARGETS)]
    pub target: Option<String>,
}

fn fuzz_dir() -> PathBuf {
    workspace_root().join("gpreempt").join("fuzz")
}

/// Seed files for `target` (copied into its corpus once).
fn seeds(target: &str) -> Vec<PathBuf> {
    let root = workspace_root();
    let dir = match target {
        "debugfs" => root.join("fixtures/debugfs-mi308x"),
        "kallsyms" => root.join("gpreempt/src/trace/fixtures"),
        _ => return Vec::new(),
    };
    fs::read_dir(dir)
        .map(|entries| entries.filter_map(std::result::Result::ok).map(|e| e.path()).filter(|p| p.is_file()).collect())
        .unwrap_or_default()
}

/// A minimal valid BTF blob (header, `int`, `struct queue { int queue_id; }` at bit 384), so the
/// BTF target starts past the magic check.
fn btf_seed() -> Vec<u8> {
    let strings = b"\0int\0queue\0queue_id\0";
    let words: [u32; 10] = [
        1,
        1 << 24, // INT "int"
        4,
        32,
        5,
        (4 << 24) | 1, // STRUCT "queue", 1 member
        64,
        11,
        1,
        384, // member "queue_id": type 1, bit 384
    ];
    let types: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let mut out = vec![0x9f, 0xeb, 1, 0];
    for w in [24u32, 0, types.len() as u32, types.len() as u32, strings.len() as u32] {
        out.extend_from_slice(&w.to_le_bytes());
    }
    out.extend_from_slice(&types);
    out.extend_from_slice(strings);
    out
}

fn ensure_cargo_fuzz() -> Result<()> {
    if succeeds("cargo", &["+nightly", "fuzz", "--version"]) {
        return Ok(());
    }
    println!("xtask fuzz: installing cargo-fuzz (first use, a few minutes)…");
    run(cargo().args(["install", "cargo-fuzz", "--locked"]))
}

pub fn run_fuzz(args: &FuzzArgs) -> Result<()> {
    ensure_cargo_fuzz()?;
    let targets: Vec<&str> = match &args.target {
        Some(t) => vec![t.as_str()],
        None => TARGETS.to_vec(),
    };
    let mut failed = Vec::new();
    for target in targets {
        let corpus = fuzz_dir().join("corpus").join(target);
        fs::create_dir_all(&corpus).with_context(|| format!("creating {}", corpus.display()))?;
        for seed in seeds(target) {
            if let Some(name) = seed.file_name() {
                let _ = fs::copy(&seed, corpus.join(name));
            }
        }
        if target == "btf" {
            let _ = fs::write(corpus.join("seed-minimal"), btf_seed());
        }
        let mut cmd = Command::new("cargo");
        // Build outside the source tree (cargo-fuzz would otherwise use gpreempt/target).
        // Absolute: cargo-fuzz runs in gpreempt/, where a relative CARGO_TARGET_DIR would land.
        let target_dir = workspace_root().join(crate::util::target_dir()).join("fuzz");
        cmd.args(["+nightly", "fuzz", "run", target, "--target-dir"])
            .arg(&target_dir)
            .arg(&corpus)
            .args(["--", &format!("-max_total_time={}", args.seconds), "-max_len=65536"])
            .env("AYA_BUILD_SKIP", "1")
            .current_dir(workspace_root().join("gpreempt"));
        println!("xtask fuzz: {}", describe(&cmd));
        let status = cmd.status().with_context(|| format!("cannot start {}", describe(&cmd)))?;
        if !status.success() {
            failed.push(target);
        }
    }
    if !failed.is_empty() {
        bail!("fuzz targets failed (crash inputs in gpreempt/fuzz/artifacts/): {}", failed.join(", "));
    }
    println!("xtask fuzz: every target ran {} s without a crash", args.seconds);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_has_a_source_file_and_a_bin_entry() {
        let manifest = fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
        for t in TARGETS {
            assert!(fuzz_dir().join("fuzz_targets").join(format!("{t}.rs")).is_file(), "{t}");
            assert!(manifest.contains(&format!("name = \"{t}\"")), "{t}");
        }
        assert_eq!(seeds("debugfs").len(), 5);
        assert_eq!(seeds("kallsyms").len(), 4, "Debian 5.10, 6.1, 6.12 and 7.3");
    }
}
