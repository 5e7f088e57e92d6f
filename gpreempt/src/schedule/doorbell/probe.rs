//! The doorbell uprobe, loaded once per scheduler: attached per online process to each ROCm
//! runtime it maps, filtered in the kernel on the registered doorbell signals, one hit per armed
//! queue through a ring buffer whose fd the reaction thread waits on.

use std::{
    collections::BTreeMap,
    num::NonZeroU32,
    os::fd::{AsRawFd, RawFd},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuHashMap, PerCpuValues, RingBuf},
    programs::{
        ProgramError, UProbe,
        uprobe::{UProbeAttachLocation, UProbeLinkId, UProbeScope},
    },
};
use gpreempt_common::doorbell::{ARMED_MAP, DoorbellHit, DoorbellKey, HITS_MAP, PROGRAM, STORES_MAP};

use super::{
    library::{RuntimeLibrary, runtime_libraries},
    target::{ProbePoint, probe_points},
};
use crate::{domain::HostPid, schedule::reaper::Reaper};

/// The doorbell object built by `build.rs` (empty when built with `AYA_BUILD_SKIP=1`).
static DOORBELL_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/doorbell"));

/// The runtime's exports that ring a doorbell: `hsa_signal_store_screlease` (ROCclr's dispatch
/// path; `hsa_signal_store_release` is the same address) and `hsa_signal_store_relaxed` (raw HSA
/// clients). The `silent` stores do not ring (they only write the value).
pub const STORE_SYMBOLS: [&str; 2] = ["hsa_signal_store_screlease", "hsa_signal_store_relaxed"];

#[derive(Debug, thiserror::Error)]
pub enum DoorbellError {
    #[error("this gpreempt binary was built with AYA_BUILD_SKIP=1 and has no doorbell probe: rebuild without it")]
    NoObject,
    #[error("loading the doorbell probe failed: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("the doorbell probe object has no {0} (the object and this binary disagree)")]
    Missing(&'static str),
    #[error("doorbell probe map {name}: {cause}")]
    Map { name: &'static str, cause: aya::maps::MapError },
    #[error("doorbell probe: {0}")]
    Program(#[from] ProgramError),
    #[error("cannot read the memory map of pid {pid}: {cause}")]
    Maps { pid: HostPid, cause: std::io::Error },
}

/// How an online process is seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Coverage {
    /// The probe is attached to each runtime library it maps (their paths, as it sees them), at
    /// these points (see [`super::target`]).
    Probe { libraries: Vec<String>, points: Vec<ProbePoint> },
    /// It maps no ROCm runtime (a raw KFD client, or one not started yet): the index poll only.
    NoRuntime,
    /// Attaching failed (the reason): the index poll only.
    Failed(String),
}

impl Coverage {
    pub fn covered(&self) -> bool {
        matches!(self, Coverage::Probe { .. })
    }
}

/// The loaded probe and its per-process attachments; dropping it detaches every uprobe and
/// frees the maps.
pub struct DoorbellProbe {
    ebpf: Ebpf,
    armed: HashMap<MapData, DoorbellKey, u32>,
    stores: PerCpuHashMap<MapData, DoorbellKey, u64>,
    hits: RingBuf<MapData>,
    /// Per covered process: its uprobe links and the library files they are on.
    links: BTreeMap<HostPid, Vec<UProbeLinkId>>,
    cpus: usize,
    /// Closes a process's links off the reaction thread (each close waits for RCU grace
    /// periods, `reaper.rs`). Declared after `ebpf`: the links still attached at drop are closed
    /// first, then the reaper's are.
    reaper: Reaper,
    /// Processes whose links the reaper may still be closing, with their last link's ticket: one
    /// covered again waits for them first (two links on one process would run the program twice
    /// per store). Entries go once their links are closed, so only those in flight are kept.
    reaping: Vec<(HostPid, u64)>,
}

impl DoorbellProbe {
    /// Load the object (needs CAP_BPF and CAP_PERFMON, or root); nothing is attached yet.
    pub fn load() -> Result<Self, DoorbellError> {
        if DOORBELL_OBJECT.is_empty() {
            return Err(DoorbellError::NoObject);
        }
        let mut ebpf = EbpfLoader::new().load(DOORBELL_OBJECT)?;
        let map = |ebpf: &mut Ebpf, name: &'static str| ebpf.take_map(name).ok_or(DoorbellError::Missing(name));
        let armed = HashMap::try_from(map(&mut ebpf, ARMED_MAP)?)
            .map_err(|cause| DoorbellError::Map { name: ARMED_MAP, cause })?;
        let stores = PerCpuHashMap::try_from(map(&mut ebpf, STORES_MAP)?)
            .map_err(|cause| DoorbellError::Map { name: STORES_MAP, cause })?;
        let hits = RingBuf::try_from(map(&mut ebpf, HITS_MAP)?)
            .map_err(|cause| DoorbellError::Map { name: HITS_MAP, cause })?;
        let program: &mut UProbe = ebpf.program_mut(PROGRAM).ok_or(DoorbellError::Missing(PROGRAM))?.try_into()?;
        program.load()?;
        // Per-CPU values are sized by the possible CPUs, as the kernel sizes them.
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| DoorbellError::Maps { pid: HostPid(0), cause: e })?;
        Ok(Self {
            ebpf,
            armed,
            stores,
            hits,
            links: BTreeMap::new(),
            cpus,
            reaper: Reaper::spawn("gpreempt-reaper"),
            reaping: Vec::new(),
        })
    }

    fn program(&mut self) -> Result<&mut UProbe, DoorbellError> {
        Ok(self.ebpf.program_mut(PROGRAM).ok_or(DoorbellError::Missing(PROGRAM))?.try_into()?)
    }

    /// Attach to every runtime library `pid` maps now. A process already covered is attached
    /// again only to libraries it did not map before (never twice to one).
    pub fn cover(&mut self, pid: HostPid) -> Coverage {
        let libraries = match runtime_libraries(pid) {
            Ok(l) => l,
            Err(cause) => return Coverage::Failed(DoorbellError::Maps { pid, cause }.to_string()),
        };
        if libraries.is_empty() {
            return Coverage::NoRuntime;
        }
        match self.attach_all(pid, &libraries) {
            Ok(points) => Coverage::Probe { libraries: libraries.into_iter().map(|l| l.path).collect(), points },
            Err(e) => {
                self.uncover(pid);
                Coverage::Failed(e.to_string())
            }
        }
    }

    fn attach_all(&mut self, pid: HostPid, libraries: &[RuntimeLibrary]) -> Result<Vec<ProbePoint>, DoorbellError> {
        let Some(scope) = NonZeroU32::new(pid.0) else { return Err(DoorbellError::Missing("a pid")) };
        if self.links.contains_key(&pid) {
            return Ok(Vec::new());
        }
        if self.reaping.iter().any(|&(p, ticket)| p == pid && !self.reaper.dropped_through(ticket)) {
            self.settle();
        }
        let (mut links, mut attached) = (Vec::new(), Vec::new());
        let mut result = Ok(());
        'libraries: for library in libraries {
            let points = probe_points(pid, library, &STORE_SYMBOLS);
            let mut offsets = Vec::new();
            for symbol in STORE_SYMBOLS {
                let point = points.iter().find(|p| p.symbol == symbol && p.implementation);
                // Two exports sharing one implementation are probed once (each store counted once).
                if let Some(p) = point {
                    if offsets.contains(&p.offset) {
                        continue;
                    }
                    offsets.push(p.offset);
                }
                let location = point
                    .map_or(UProbeAttachLocation::Symbol(symbol), |p| UProbeAttachLocation::AbsoluteOffset(p.offset));
                match self.program().and_then(|p| {
                    p.attach(location, &library.open_path, UProbeScope::OneProcess(scope)).map_err(DoorbellError::from)
                }) {
                    Ok(link) => links.push(link),
                    Err(e) => {
                        result = Err(e);
                        break 'libraries;
                    }
                }
                attached.extend(points.iter().find(|p| p.symbol == symbol).cloned());
            }
        }
        self.links.insert(pid, links);
        result.map(|()| attached)
    }

    /// Detach `pid`'s uprobes and forget its doorbells (it exited, or is no longer online). Its
    /// doorbells send nothing from here on; its links close on the reaper's thread
    /// ([`DoorbellProbe::settle`] waits for them).
    pub fn uncover(&mut self, pid: HostPid) {
        if let Some(links) = self.links.remove(&pid)
            && let Ok(program) = self.program()
        {
            // Taken out of the program and closed on the reaper's thread: each close waits for
            // RCU grace periods (`reaper.rs`). The armed keys go below, at once, so the uprobe
            // sends nothing in the meantime.
            let taken: Vec<_> = links.into_iter().filter_map(|link| program.take_link(link).ok()).collect();
            let last = taken.into_iter().map(|link| self.reaper.reap(link)).last();
            let reaper = &self.reaper;
            self.reaping.retain(|&(p, ticket)| p != pid && !reaper.dropped_through(ticket));
            if let Some(ticket) = last {
                self.reaping.push((pid, ticket));
            }
        }
        let keys: Vec<DoorbellKey> = self.armed.keys().filter_map(Result::ok).filter(|k| k.tgid == pid.0).collect();
        for key in keys {
            let _ = self.armed.remove(&key);
            let _ = self.stores.remove(&key);
        }
    }

    /// Wait until the links of every process uncovered so far are closed (their uprobes out of
    /// the processes' text): for tests, and for timing a whole detach.
    pub fn settle(&mut self) {
        self.reaper.settle();
        self.reaping.clear();
    }

    /// Whether `pid` is attached.
    pub fn covers(&self, pid: HostPid) -> bool {
        self.links.contains_key(&pid)
    }

    /// Filter on this queue's doorbell signal, armed.
    pub fn register(&mut self, pid: HostPid, signal: u64) -> Result<(), DoorbellError> {
        let key = DoorbellKey { tgid: pid.0, _pad: 0, signal };
        let zeros = PerCpuValues::try_from(vec![0u64; self.cpus])
            .map_err(|cause| DoorbellError::Map { name: STORES_MAP, cause: aya::maps::MapError::from(cause) })?;
        self.stores.insert(key, zeros, 0).map_err(|cause| DoorbellError::Map { name: STORES_MAP, cause })?;
        self.arm(pid, signal)
    }

    /// Stop filtering on it (the queue was destroyed).
    pub fn unregister(&mut self, pid: HostPid, signal: u64) {
        let key = DoorbellKey { tgid: pid.0, _pad: 0, signal };
        let _ = self.armed.remove(&key);
        let _ = self.stores.remove(&key);
    }

    /// Arm it: the next store on it sends one hit.
    pub fn arm(&mut self, pid: HostPid, signal: u64) -> Result<(), DoorbellError> {
        let key = DoorbellKey { tgid: pid.0, _pad: 0, signal };
        self.armed.insert(key, 1, 0).map_err(|cause| DoorbellError::Map { name: ARMED_MAP, cause })
    }

    /// Stores seen on it since it was registered (every CPU's count summed).
    pub fn stores(&self, pid: HostPid, signal: u64) -> Option<u64> {
        let key = DoorbellKey { tgid: pid.0, _pad: 0, signal };
        self.stores.get(&key, 0).ok().map(|per_cpu| per_cpu.iter().sum())
    }

    /// Take every hit waiting in the ring buffer.
    pub fn drain(&mut self, out: &mut Vec<DoorbellHit>) {
        while let Some(item) = self.hits.next() {
            if item.len() >= size_of::<DoorbellHit>() {
                // SAFETY: the record the program wrote, a `#[repr(C)]` Pod of this size; the ring
                // buffer's data need not be aligned for it, hence the unaligned read.
                out.push(unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<DoorbellHit>()) });
            }
        }
    }

    /// The ring buffer's fd: readable when hits are waiting (epoll/poll).
    pub fn fd(&self) -> RawFd {
        self.hits.as_raw_fd()
    }
}
