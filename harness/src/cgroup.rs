//! A cgroup v2 of the run's own, for the served online client: the arrival probe is a
//! `cgroup_skb` program, attached to the cgroup of the process it watches, and a packet is seen
//! by the programs of the cgroup its socket belongs to — the cgroup of the task that created the
//! socket (`sk_cgrp_data`, set at `socket()` and inherited by the connections `accept()`
//! returns, net/core/sock.c `sk_clone_lock`). So the client is placed here before it runs (at
//! exec, through `pre_exec`), and every socket it makes is charged here. Created under the
//! unified hierarchy's mount (`/sys/fs/cgroup/unified` on this hybrid host), removed when
//! dropped — [`crate::started::Started`] owns it and drops it after it reaped the client.

use std::{
    ffi::CString,
    fs, io,
    os::unix::{ffi::OsStrExt, process::CommandExt},
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use gpreempt::host::cgroup::unified_mount;

/// The directories this harness creates: `PREFIX<pid>-<n>` (a crashed run's are swept).
const PREFIX: &str = "gpreempt-harness-";

/// A cgroup v2 directory of this run's, removed when dropped.
#[derive(Debug)]
pub struct OwnCgroup {
    dir: PathBuf,
    /// `cgroup.procs`, made ready before any fork.
    procs: CString,
}

static NEXT: AtomicU64 = AtomicU64::new(0);

impl OwnCgroup {
    /// A fresh cgroup under the unified mount (needs root, or a delegated subtree).
    pub fn create() -> Result<Self> {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
        let mount = unified_mount(&mountinfo).context("no cgroup v2 hierarchy is mounted (no cgroup2 in mountinfo)")?;
        sweep_stale(&mount);
        let dir = mount.join(format!("{PREFIX}{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
        fs::create_dir(&dir).with_context(|| format!("creating cgroup {}", dir.display()))?;
        let procs =
            CString::new(dir.join("cgroup.procs").as_os_str().as_bytes()).context("a cgroup path with a NUL byte")?;
        Ok(Self { dir, procs })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The processes in it now.
    pub fn pids(&self) -> io::Result<Vec<u32>> {
        let text = fs::read_to_string(self.dir.join("cgroup.procs"))?;
        Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// `cmd`'s process joins this cgroup between its fork and its exec.
    pub fn place(&self, cmd: &mut Command) {
        let procs = self.procs.clone();
        // SAFETY: the closure runs in the forked child before exec and only makes the
        // async-signal-safe calls open, write and close on memory allocated before the fork.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                // "0": the writing process (kernel/cgroup/cgroup.c `cgroup_procs_write_start`).
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = io::Error::last_os_error();
                libc::close(fd);
                if n == 1 { Ok(()) } else { Err(err) }
            });
        }
    }
}

impl Drop for OwnCgroup {
    fn drop(&mut self) {
        // A process reaped just now may still be leaving it (EBUSY for a moment).
        let by = Instant::now() + Duration::from_secs(2);
        while let Err(e) = fs::remove_dir(&self.dir) {
            if e.kind() == io::ErrorKind::NotFound || Instant::now() > by {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Remove the cgroups a harness that is gone left behind (empty ones: rmdir refuses the others).
fn sweep_stale(mount: &Path) {
    let Ok(entries) = fs::read_dir(mount) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)).and_then(|r| r.split('-').next()) else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            let _ = fs::remove_dir(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::process::Stdio;

    use super::*;

    #[test]
    fn a_placed_process_runs_in_it_from_its_first_instruction_and_the_dir_goes_with_the_owner() {
        // This project's machines mount cgroup v2 (hybrid: at /sys/fs/cgroup/unified) and the
        // tests run as root.
        let cg = OwnCgroup::create().expect("a cgroup of our own");
        let dir = cg.dir().to_path_buf();
        assert!(dir.join("cgroup.procs").is_file());
        let mut cmd = Command::new("cat");
        cmd.arg("/proc/self/cgroup").stdout(Stdio::piped());
        cg.place(&mut cmd);
        let out = cmd.output().expect("cat runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let name = dir.file_name().unwrap().to_str().unwrap();
        assert!(text.lines().any(|l| l == format!("0::/{name}")), "{text}");
        assert_eq!(cg.pids().unwrap(), Vec::<u32>::new(), "reaped: gone from it");
        drop(cg);
        assert!(!dir.exists());
    }
}
