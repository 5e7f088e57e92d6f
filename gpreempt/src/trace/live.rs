//! A running tracer: the full probe table attached and its event stream open, as `gpreempt
//! trace`, `gpreempt agent`, `gpreempt preempt` and `gpreempt schedule` all start it.

use std::path::Path;

use crate::kfd::KfdVersion;

use super::{
    loader::{self, AttachedProbes, LoadError},
    probes,
    stream::{EventStream, StreamError},
};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Stream(#[from] StreamError),
    #[error("the tracer's thread ended before it attached (it panicked)")]
    Gone,
}

/// The attached probes (they stay attached while this lives) and their stream.
pub struct Live {
    pub attached: AttachedProbes,
    pub stream: EventStream,
    /// eBPF-side warnings (aya-log) go to the `log` logger while this lives; without the log
    /// map nothing is lost.
    pub ebpf_log: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
}

impl Live {
    /// Attach every probe this kernel offers (BTF from `btf_dir`) and open the ring buffer.
    /// `version`: the KFD version when the caller already read it (the probe table's minimums);
    /// `None` reads it.
    pub fn start(version: Option<KfdVersion>, btf_dir: &Path) -> Result<Self, StartError> {
        let mut attached = loader::attach(probes::PROBES, version, btf_dir)?;
        let ebpf_log = aya_log::EbpfLogger::init(&mut attached.ebpf).ok();
        let stream = EventStream::new(&mut attached)?;
        // Loading parsed vmlinux and module BTF (tens of MiB, freed again once the programs are
        // loaded); give those pages back rather than keep them resident for the whole trace.
        #[cfg(target_env = "gnu")]
        // SAFETY: malloc_trim has no preconditions; it only returns free heap pages to the kernel.
        unsafe {
            libc::malloc_trim(0);
        }
        Ok(Self { attached, stream, ebpf_log })
    }

    /// Probes attached, and probes of the table this kernel lacks.
    pub fn probe_counts(&self) -> (usize, usize) {
        let attached = self.attached.attached_count();
        let missing = self.attached.probes.iter().filter(|p| p.symbol.is_none()).count();
        (attached, missing)
    }
}
