//! A process's cgroup v2 directory: where a `cgroup_skb` program is attached to see the packets
//! delivered to its sockets. The unified hierarchy's mount point comes from `/proc/self/mountinfo`
//! (filesystem type `cgroup2`: `/sys/fs/cgroup` on a pure v2 host, `/sys/fs/cgroup/unified` on a
//! hybrid one); the process's path in it from the `0::PATH` line of `/proc/PID/cgroup`.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use crate::domain::HostPid;

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "no cgroup v2 hierarchy is mounted (no cgroup2 line in /proc/self/mountinfo): mount one, e.g. `mount -t cgroup2 none /sys/fs/cgroup`"
    )]
    NoUnified,
    #[error("process {pid} is in no cgroup v2 (no `0::` line in its /proc/{pid}/cgroup)")]
    NotInUnified { pid: HostPid },
    #[error("cannot read {}: {cause}", path.display())]
    Io { path: PathBuf, cause: io::Error },
    #[error(
        "process {pid}'s cgroup {} is not under this mount namespace's cgroup2 mount (gpreempt runs in another \
         cgroup namespace: run it with the host's, e.g. hostPID and a privileged pod)",
        path.display()
    )]
    Unreachable { pid: HostPid, path: PathBuf },
}

/// The mount point of the cgroup2 filesystem in a `mountinfo` text, if any.
pub fn unified_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // id parent major:minor root mountpoint options [optional…] - fstype source super-options
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        left.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// The path of the `0::PATH` line of a `/proc/PID/cgroup` text.
pub fn unified_path(cgroup: &str) -> Option<&str> {
    cgroup.lines().find_map(|l| l.strip_prefix("0::"))
}

/// `pid`'s cgroup v2 directory.
pub fn cgroup_dir(proc_root: &Path, pid: HostPid) -> Result<PathBuf, CgroupError> {
    let read = |path: PathBuf| fs::read_to_string(&path).map_err(|cause| CgroupError::Io { path, cause });
    let mount = unified_mount(&read(proc_root.join("self/mountinfo"))?).ok_or(CgroupError::NoUnified)?;
    let text = read(proc_root.join(pid.0.to_string()).join("cgroup"))?;
    let path = unified_path(&text).ok_or(CgroupError::NotInUnified { pid })?;
    let dir = mount.join(path.trim_start_matches('/'));
    if !dir.is_dir() {
        return Err(CgroupError::Unreachable { pid, path: dir });
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unified_mount_is_found_on_hybrid_and_pure_hosts() {
        // This project's machine (hybrid: v1 controllers, v2 at unified) and a pure v2 host.
        let hybrid = "30 24 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw
32 30 0:28 / /sys/fs/cgroup/cpu rw,relatime shared:11 - cgroup cgroup rw,cpu";
        assert_eq!(unified_mount(hybrid), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        let pure =
            "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate";
        assert_eq!(unified_mount(pure), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(unified_mount("32 30 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu"), None);
    }

    #[test]
    fn the_unified_line_gives_the_path() {
        let v1_and_v2 = "4:memory:/user.slice\n0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-ab.scope\n";
        assert_eq!(unified_path(v1_and_v2), Some("/kubepods.slice/kubepods-pod1.slice/cri-containerd-ab.scope"));
        assert_eq!(unified_path("4:memory:/user.slice\n"), None);
    }

    #[test]
    fn this_process_has_a_cgroup_dir_under_the_unified_mount() {
        // This project's machines mount cgroup v2 (hybrid: at /sys/fs/cgroup/unified).
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
        let mount = unified_mount(&mountinfo).expect("a cgroup2 mount on this machine");
        let dir = cgroup_dir(Path::new("/proc"), HostPid(std::process::id())).expect("this process's cgroup dir");
        assert!(dir.starts_with(&mount), "{} not under {}", dir.display(), mount.display());
        assert!(dir.join("cgroup.procs").is_file(), "{} is no cgroup", dir.display());
    }
}
