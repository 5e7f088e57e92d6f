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
