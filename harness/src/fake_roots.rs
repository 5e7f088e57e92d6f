//! The sysfs and /proc entries the real scheduler checks before it accepts a pid (a KFD process:
//! `/sys/class/kfd/kfd/proc/<pid>`, with queues when it has them; `/proc/<pid>/status`), written
//! under a private root for the client processes, which have no /dev/kfd. The same approach as
//! `gpreempt/benches/reaction.rs` (`kfd_process`), for several queues and GPUs.

use std::{fs, io, path::PathBuf};

use gpreempt::{domain::GpuId, host::roots::Roots};

/// A private root, removed when dropped.
pub struct FakeRoots {
    dir: PathBuf,
}

impl FakeRoots {
    pub fn new() -> io::Result<Self> {
        let dir = crate::shm::fresh_path("roots");
        let dir = std::env::temp_dir().join(dir.file_name().unwrap_or_default());
        fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }

    /// A KFD process `pid` with one queue per `(queue id, GPU)`.
    pub fn kfd_process(&self, pid: u32, queues: &[(u32, GpuId)]) -> io::Result<()> {
        let kfd = self.dir.join(format!("sys/class/kfd/kfd/proc/{pid}"));
        for &(id, gpu) in queues {
            let q = kfd.join(format!("queues/{id}"));
            fs::create_dir_all(&q)?;
            fs::write(q.join("gpuid"), gpu.0.to_string())?;
            fs::write(q.join("type"), "0")?;
        }
        fs::create_dir_all(&kfd)?;
        fs::write(kfd.join("pasid"), "32770\n")?;
        let proc_dir = self.dir.join(format!("proc/{pid}"));
        fs::create_dir_all(&proc_dir)?;
        fs::write(proc_dir.join("comm"), "harness-client\n")?;
        fs::write(proc_dir.join("status"), format!("Name:\tharness-client\nNSpid:\t{pid}\n"))?;
        fs::write(proc_dir.join("cgroup"), "0::/user.slice\n")
    }

    /// A served online client: the scheduler's arrival path finds its cgroup v2 directory and
    /// its listening ports under the roots (`host::cgroup`: `proc/self/mountinfo` and
    /// `proc/PID/cgroup`; `host::sockets`: `proc/PID/fd` and `proc/PID/net`), so those are the
    /// real ones: the cgroup line copied, the rest linked to `/proc`.
    pub fn served_process(&self, pid: u32) -> io::Result<()> {
        let proc_dir = self.dir.join(format!("proc/{pid}"));
        fs::create_dir_all(&proc_dir)?;
        fs::write(proc_dir.join("cgroup"), fs::read(format!("/proc/{pid}/cgroup"))?)?;
        for entry in ["fd", "net"] {
            std::os::unix::fs::symlink(format!("/proc/{pid}/{entry}"), proc_dir.join(entry))?;
        }
        let me = self.dir.join("proc/self");
        if fs::symlink_metadata(&me).is_err() {
            std::os::unix::fs::symlink("/proc/self", me)?;
        }
        Ok(())
    }

    /// A file inside the root (the clients' specs live here too).
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn roots(&self) -> Roots {
        Roots {
            sys: self.dir.join("sys"),
            proc: self.dir.join("proc"),
            docker: self.dir.join("docker"),
            ..Roots::default()
        }
    }
}

impl Drop for FakeRoots {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeSet, net::TcpListener, path::Path};

    use gpreempt::{
        domain::HostPid,
        host::{cgroup::cgroup_dir, sockets::tcp_listening_ports},
    };

    use super::*;

    #[test]
    fn a_served_process_shows_its_real_cgroup_and_ports_under_the_roots() {
        let roots = FakeRoots::new().unwrap();
        let me = std::process::id();
        roots.kfd_process(me, &[(0, GpuId(1))]).unwrap();
        roots.served_process(me).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let proc_root = roots.roots().proc;
        let ports = tcp_listening_ports(&proc_root, HostPid(me)).unwrap();
        assert!(ports.contains(&port), "{port} not in {ports:?}");
        let real = cgroup_dir(Path::new("/proc"), HostPid(me)).unwrap();
        assert_eq!(cgroup_dir(&proc_root, HostPid(me)).unwrap(), real);
        // The KFD entries stay the fake ones; the same pid twice is refused.
        assert!(proc_root.join(format!("{me}/status")).is_file());
        assert_eq!(roots.served_process(me).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        drop(listener);
        let ports = tcp_listening_ports(&proc_root, HostPid(me)).unwrap();
        assert!(ports.is_disjoint(&BTreeSet::from([port])));
        let dir = roots.file("");
        drop(roots);
        assert!(!dir.exists());
        assert!(Path::new("/proc/self/fd").is_dir(), "the links were removed, not their targets");
    }
}
