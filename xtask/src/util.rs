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

/// Below this, a build fails whatever is already built (a linker writes its output whole).
const FREE_FLOOR_BYTES: u64 = 2 << 30;

/// Check the free space of the filesystem holding `dir` (or its nearest existing ancestor): an
/// error below [`FREE_FLOOR_BYTES`], a warning on stderr below `wanted` (what the run writes when
/// nothing is built yet). A full disk otherwise shows as a linker's bus error minutes in.
pub fn check_free_space(dir: &Path, wanted: u64) -> Result<()> {
    let free = free_bytes(dir)?;
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    if free < FREE_FLOOR_BYTES {
        bail!(
            "only {:.1} GiB free on the filesystem of {}: builds will fail (No space left on device); \
             free space (old target directories, `cargo clean`) and run again",
            gib(free),
            dir.display()
        );
    }
    if free < wanted {
        eprintln!(
            "xtask: warning: {:.1} GiB free on the filesystem of {}; a run from an empty target directory \
             writes about {:.0} GiB, so a build may fail with `No space left on device`",
            gib(free),
            dir.display(),
            gib(wanted)
        );
    }
    Ok(())
}

/// Bytes available to an unprivileged writer on the filesystem holding `dir` or its nearest
/// existing ancestor.
fn free_bytes(dir: &Path) -> Result<u64> {
    let existing = dir.ancestors().find(|d| d.exists()).unwrap_or(Path::new("/"));
    let path = std::ffi::CString::new(existing.as_os_str().as_encoded_bytes())
        .with_context(|| format!("{} contains a NUL byte", existing.display()))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `path` is NUL-terminated and `st` is valid for writes of one statvfs.
    if unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("statvfs {}", existing.display()));
    }
    // SAFETY: statvfs returned 0, so it filled the struct.
    let st = unsafe { st.assume_init() };
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_filesystem_is_an_error_found_through_the_nearest_existing_ancestor() {
        // procfs reports no free blocks; the path below it does not exist, so its ancestor `/proc`
        // is what is asked.
        let err = check_free_space(Path::new("/proc/no/such/target"), 0).unwrap_err().to_string();
        assert!(err.starts_with("only 0.0 GiB free on the filesystem of /proc/no/such/target"), "{err}");
        assert!(err.contains("No space left on device"), "{err}");
    }
}
