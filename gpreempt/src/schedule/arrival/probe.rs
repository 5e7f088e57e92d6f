//! The arrival program, loaded once per scheduler: attached once per online cgroup (v2), filtered
//! in the kernel on the online processes' listening ports and the request patterns, one hit per
//! armed slot through a ring buffer whose fd the reaction thread waits on.
//!
//! A slot is one online process: its ports map to it, its armed flag and counts are indexed by
//! it. Attachments are bpf_links (Linux ≥ 5.7, `bpf_link_create` with a cgroup fd, kernel/bpf/
//! cgroup.c `cgroup_bpf_link_attach`): they live as long as their fd, so a scheduler that dies,
//! even by `kill -9`, leaves no program attached. A link is always one of several programs on the
//! cgroup (links attach with BPF_F_ALLOW_MULTI semantics), so it never displaces another's.

use std::{
    collections::BTreeSet,
    os::fd::{AsFd, AsRawFd, RawFd},
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, Map, MapData, PerCpuArray, PerCpuValues, RingBuf},
    programs::{CgroupAttachMode, CgroupSkb, CgroupSkbAttachType, ProgramError, cgroup_skb::CgroupSkbLinkId},
};
use gpreempt_common::arrival::{
    ARMED_MAP, ArrivalCounts, ArrivalHit, COUNTS_MAP, HITS_MAP, MAX_SLOTS, PATTERNS_MAP, PORTS_MAP, PROGRAM,
};

use super::{armed::ArmedFlags, patterns::Patterns};
use crate::domain::HostPid;

/// The arrival object built by `build.rs` (empty when built with `AYA_BUILD_SKIP=1`).
static ARRIVAL_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/arrival"));

#[derive(Debug, thiserror::Error)]
pub enum ArrivalError {
    #[error("this gpreempt binary was built with AYA_BUILD_SKIP=1 and has no arrival probe: rebuild without it")]
    NoObject,
    #[error("loading the arrival probe failed: {0} (it needs CAP_BPF and CAP_NET_ADMIN, or root)")]
    Load(#[from] aya::EbpfError),
    #[error("the arrival probe object has no {0} (the object and this binary disagree)")]
    Missing(&'static str),
    #[error("arrival probe map {name}: {cause}")]
    Map { name: &'static str, cause: aya::maps::MapError },
    #[error(
        "arrival probe map {name}: mapping its values failed ({cause}); it is created BPF_F_MMAPABLE, which needs \
         Linux 5.5 or later"
    )]
    Mmap { name: &'static str, cause: std::io::Error },
    #[error("the arrival probe has no slot {0}")]
    NoSlot(u32),
    #[error("arrival probe: {0} (attaching to a cgroup needs CAP_NET_ADMIN and CAP_BPF, or root)")]
    Program(#[from] ProgramError),
    #[error("cannot open cgroup {}: {cause}", path.display())]
    Cgroup { path: PathBuf, cause: std::io::Error },
    #[error("the arrival probe watches {MAX_SLOTS} online processes at most")]
    Full,
    #[error("port {port} is already watched for online pid {owner}")]
    PortTaken { port: u16, owner: HostPid },
}

/// One watched online process.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Slot {
    pid: HostPid,
    cgroup: PathBuf,
    ports: BTreeSet<u16>,
}

/// The loaded program and its attachments; dropping it detaches every link and frees the maps.
pub struct ArrivalProbe {
    ebpf: Ebpf,
    ports: HashMap<MapData, u32, u32>,
    armed: ArmedFlags,
    /// The armed map's fd: the program's instructions name it until the program is loaded.
    _armed_map: MapData,
    counts: PerCpuArray<MapData, ArrivalCounts>,
    hits: RingBuf<MapData>,
    /// Attached cgroups and their links.
    cgroups: Vec<(PathBuf, CgroupSkbLinkId)>,
    slots: Vec<Option<Slot>>,
    cpus: usize,
}

impl ArrivalProbe {
    /// Load the object with its patterns (needs CAP_BPF, or root); nothing is attached yet.
    pub fn load(patterns: &Patterns) -> Result<Self, ArrivalError> {
        if ARRIVAL_OBJECT.is_empty() {
            return Err(ArrivalError::NoObject);
        }
        let mut ebpf = EbpfLoader::new().load(ARRIVAL_OBJECT)?;
        let map = |ebpf: &mut Ebpf, name: &'static str| ebpf.take_map(name).ok_or(ArrivalError::Missing(name));
        let err = |name| move |cause| ArrivalError::Map { name, cause };
        let ports = HashMap::try_from(map(&mut ebpf, PORTS_MAP)?).map_err(err(PORTS_MAP))?;
        let Map::Array(armed_map) = map(&mut ebpf, ARMED_MAP)? else {
            return Err(ArrivalError::Missing(ARMED_MAP));
        };
        let armed = ArmedFlags::map(armed_map.fd().as_fd().as_raw_fd())
            .map_err(|cause| ArrivalError::Mmap { name: ARMED_MAP, cause })?;
        let counts = PerCpuArray::try_from(map(&mut ebpf, COUNTS_MAP)?).map_err(err(COUNTS_MAP))?;
        let hits = RingBuf::try_from(map(&mut ebpf, HITS_MAP)?).map_err(err(HITS_MAP))?;
        let mut table: Array<MapData, gpreempt_common::arrival::Pattern> =
            Array::try_from(map(&mut ebpf, PATTERNS_MAP)?).map_err(err(PATTERNS_MAP))?;
        for (i, p) in patterns.table().iter().enumerate() {
            table.set(i as u32, p, 0).map_err(err(PATTERNS_MAP))?;
        }
        let program: &mut CgroupSkb = ebpf.program_mut(PROGRAM).ok_or(ArrivalError::Missing(PROGRAM))?.try_into()?;
        program.load()?;
        let cpus = aya::util::nr_cpus()
            .map_err(|(_, cause)| ArrivalError::Cgroup { path: "/sys/devices/system/cpu/possible".into(), cause })?;
        Ok(Self {
            ebpf,
            ports,
            armed,
            _armed_map: armed_map,
            counts,
            hits,
            cgroups: Vec::new(),
            slots: Vec::new(),
            cpus,
        })
    }

    fn program(&mut self) -> Result<&mut CgroupSkb, ArrivalError> {
        Ok(self.ebpf.program_mut(PROGRAM).ok_or(ArrivalError::Missing(PROGRAM))?.try_into()?)
    }

    /// Watch `pid` in `cgroup` on `ports`, armed: attaches to the cgroup unless another watched
    /// process is already there. Returns its slot.
    pub fn watch(&mut self, pid: HostPid, cgroup: &Path, ports: &BTreeSet<u16>) -> Result<u32, ArrivalError> {
        if let Some(slot) = self.slot_of(pid) {
            self.set_ports(slot, ports)?;
            return Ok(slot);
        }
        let index = match self.slots.iter().position(Option::is_none) {
            Some(i) => i,
            None if self.slots.len() < MAX_SLOTS as usize => {
                self.slots.push(None);
                self.slots.len() - 1
            }
            None => return Err(ArrivalError::Full),
        };
        let slot = index as u32;
        if !self.cgroups.iter().any(|(c, _)| c == cgroup) {
            let file = std::fs::File::open(cgroup)
                .map_err(|cause| ArrivalError::Cgroup { path: cgroup.to_path_buf(), cause })?;
            let link = self.program()?.attach(&file, CgroupSkbAttachType::Ingress, CgroupAttachMode::Single)?;
            self.cgroups.push((cgroup.to_path_buf(), link));
        }
        let zeros = PerCpuValues::try_from(vec![ArrivalCounts::default(); self.cpus])
            .map_err(|cause| ArrivalError::Map { name: COUNTS_MAP, cause: aya::maps::MapError::from(cause) })?;
        self.counts.set(slot, zeros, 0).map_err(|cause| ArrivalError::Map { name: COUNTS_MAP, cause })?;
        self.slots[index] = Some(Slot { pid, cgroup: cgroup.to_path_buf(), ports: BTreeSet::new() });
        if let Err(e) = self.set_ports(slot, ports).and_then(|()| self.arm(slot)) {
            self.unwatch(slot);
            return Err(e);
        }
        Ok(slot)
    }

    /// The slot watching `pid`.
    pub fn slot_of(&self, pid: HostPid) -> Option<u32> {
        self.slots.iter().position(|s| s.as_ref().is_some_and(|s| s.pid == pid)).map(|i| i as u32)
    }

    /// The process a slot watches.
    pub fn pid_of(&self, slot: u32) -> Option<HostPid> {
        self.slots.get(slot as usize)?.as_ref().map(|s| s.pid)
    }

    /// The ports a slot watches now.
    pub fn ports_of(&self, slot: u32) -> BTreeSet<u16> {
        self.slots.get(slot as usize).and_then(Option::as_ref).map(|s| s.ports.clone()).unwrap_or_default()
    }

    /// Watch exactly `ports` for `slot` (a refresh: a port the process closed is dropped).
    pub fn set_ports(&mut self, slot: u32, ports: &BTreeSet<u16>) -> Result<(), ArrivalError> {
        let Some(Some(current)) = self.slots.get(slot as usize) else { return Ok(()) };
        let old = current.ports.clone();
        for &port in ports.difference(&old) {
            if let Some(owner) = self.owner_of(port)
                && owner != slot
            {
                let owner = self.pid_of(owner).unwrap_or(HostPid(0));
                return Err(ArrivalError::PortTaken { port, owner });
            }
        }
        for port in old.difference(ports) {
            let _ = self.ports.remove(&u32::from(*port));
        }
        for &port in ports.difference(&old) {
            self.ports
                .insert(u32::from(port), slot, 0)
                .map_err(|cause| ArrivalError::Map { name: PORTS_MAP, cause })?;
        }
        if let Some(Some(s)) = self.slots.get_mut(slot as usize) {
            s.ports = ports.clone();
        }
        Ok(())
    }

    fn owner_of(&self, port: u16) -> Option<u32> {
        self.slots.iter().position(|s| s.as_ref().is_some_and(|s| s.ports.contains(&port))).map(|i| i as u32)
    }

    /// Stop watching `slot`: its ports go, and its cgroup's link when no other slot is there.
    pub fn unwatch(&mut self, slot: u32) {
        let Some(s) = self.slots.get_mut(slot as usize).and_then(Option::take) else { return };
        for port in &s.ports {
            let _ = self.ports.remove(&u32::from(*port));
        }
        self.armed.disarm(slot);
        if self.slots.iter().flatten().any(|o| o.cgroup == s.cgroup) {
            return;
        }
        if let Some(i) = self.cgroups.iter().position(|(c, _)| *c == s.cgroup) {
            let (_, link) = self.cgroups.remove(i);
            if let Ok(program) = self.program() {
                let _ = program.detach(link);
            }
        }
    }

    /// Arm `slot`: its next `ARMED_CREDITS` requests send one hit each (a store into the mapped
    /// map, `armed.rs`).
    pub fn arm(&mut self, slot: u32) -> Result<(), ArrivalError> {
        if self.armed.arm(slot) { Ok(()) } else { Err(ArrivalError::NoSlot(slot)) }
    }

    /// Disarm `slot`: its requests are counted and send no hit until it is armed again.
    pub fn disarm(&mut self, slot: u32) {
        self.armed.disarm(slot);
    }

    /// What the program saw for `slot` since it was watched (every CPU's counts summed).
    pub fn counts(&self, slot: u32) -> ArrivalCounts {
        let mut sum = ArrivalCounts::default();
        if let Ok(per_cpu) = self.counts.get(&slot, 0) {
            for c in per_cpu.iter() {
                sum.add(c);
            }
        }
        sum
    }

    /// Cgroups attached now.
    pub fn cgroups(&self) -> Vec<PathBuf> {
        self.cgroups.iter().map(|(c, _)| c.clone()).collect()
    }

    /// Take every hit waiting in the ring buffer.
    pub fn drain(&mut self, out: &mut Vec<ArrivalHit>) {
        while let Some(item) = self.hits.next() {
            if item.len() >= size_of::<ArrivalHit>() {
                // SAFETY: the record the program wrote, a `#[repr(C)]` Pod of this size; the ring
                // buffer's data need not be aligned for it, hence the unaligned read.
                out.push(unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<ArrivalHit>()) });
            }
        }
    }

    /// The ring buffer's fd: readable when hits are waiting (poll).
    pub fn fd(&self) -> RawFd {
        self.hits.as_raw_fd()
    }
}
