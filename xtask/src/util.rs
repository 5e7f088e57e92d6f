//! Small helpers shared by the tasks, none of them task-specific: the workspace root and cargo's
//! target directory, running commands (streamed, captured, or just whether they succeed), whether
//! we run as root. It uses no other module of xtask, so every task may use it; what the tasks
//! build lives in `binaries`.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map_or(manifest.clone(), Path::to_path_buf)
}

/// Run a command in the workspace root, streaming its output; fail with its name on error.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status =
        cmd.current_dir(workspace_root()).status().with_context(|| format!("cannot start {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("{} failed ({status})", describe(cmd));
    }
    Ok(())
}

/// Run a command and capture stdout (stderr passes through).
pub fn output(cmd: &mut Command) -> Result<String> {
    output_in(&workspace_root(), cmd)
}

/// [`output`] with `dir` as the working directory.
pub fn output_in(dir: &Path, cmd: &mut Command) -> Result<String> {
    let out = cmd
        .current_dir(dir)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot start {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!("{} failed ({})", describe(cmd), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Does this command run and exit 0 (output discarded)?
pub fn succeeds(program: &str, args: &[&str]) -> bool {
    Command::new(program).args(args).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

pub fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The directory cargo builds into.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace_root().join("target"), PathBuf::from)
}

/// The version of the `gpreempt` package (the workspace's), as cargo reads it.
pub fn package_version() -> Result<String> {
    let metadata = output(cargo().args(["metadata", "--format-version", "1", "--no-deps", "--offline"]))?;
    let metadata: serde_json::Value = serde_json::from_str(&metadata).context("parsing `cargo metadata`")?;
    metadata["packages"]
        .as_array()
        .and_then(|packages| packages.iter().find(|p| p["name"] == "gpreempt"))
        .and_then(|p| p["version"].as_str())
        .map(str::to_owned)
        .context("`cargo metadata` lists no gpreempt package with a version")
}
