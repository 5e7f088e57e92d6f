//! Missed kretprobe hits: return-probe losses the ring buffer never sees.
//!
//! A kretprobe takes one of `maxactive` instances when the probed function is entered and gives
//! it back at the return. A call made while every instance is in use (more callers inside the
//! function than instances, e.g. callers sleeping in `amdkfd_fence_wait_timeout` or in
//! `kfd_ioctl_runtime_enable`) runs without its return probe; the kernel only counts it, in the
//! kretprobe's `nmissed` (kernel/kprobes.c, 6.1 and 6.12).
//!
//! The limit cannot be raised here: aya 0.14 attaches every kprobe through the kprobe PMU
//! (`perf_event_open` of type `/sys/bus/event_source/devices/kprobe/type`), and the kernel creates
//! those with `maxactive` 0, i.e. the default max(10, 2 × possible CPUs)
//! (`create_local_trace_kprobe`, kernel/trace/trace_kprobe.c, 6.1 and 6.12: it has no maxactive
//! parameter; only a tracefs `r<N>:` definition sets one).
//!
//! The count is exposed per link from Linux 6.7: `BPF_OBJ_GET_INFO_BY_FD` on the perf-event link
//! fills `bpf_link_info.perf_event.kprobe.missed` (`bpf_perf_link_fill_kprobe`,
//! kernel/bpf/syscall.c), the kprobe's plus the kretprobe's `nmissed`. Before (6.1) nothing
//! exposes it for a PMU kprobe: link info has no perf-event fields and such kprobes are not
//! listed in tracefs `kprobe_profile`.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use aya_obj::generated::{bpf_attr, bpf_cmd, bpf_link_info, bpf_link_type, bpf_perf_event_type};

/// The first kernel that reports missed kprobe hits in the link info.
pub const MISSED_SINCE: (u32, u32) = (6, 7);

/// The kretprobe instance limit of a PMU kprobe, max(10, 2 × possible CPUs) (`register_kretprobe`,
/// kernel/kprobes.c: 6.12 always; 6.1 with CONFIG_PREEMPTION, which Debian's 6.1 and 6.12 both
/// set, else the number of possible CPUs), from the CPU list of `/sys/devices/system/cpu/possible`
/// (`0-1`, `0,2-5`).
pub fn default_maxactive(possible_cpus: &str) -> Option<u32> {
    let mut cpus = 0u32;
    for range in possible_cpus.trim().split(',') {
        let (first, last) = match range.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?),
            None => {
                let cpu = range.parse::<u32>().ok()?;
                (cpu, cpu)
            }
        };
        cpus += last.checked_sub(first)? + 1;
    }
    Some(cpus.saturating_mul(2).max(10))
}

/// Whether the running kernel can say how many return probes were missed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MissedSupport {
    /// `bpf_link_info.perf_event.kprobe.missed` is filled.
    Exposed,
    /// It is not; the reason names the kernel.
    NotExposed { reason: String },
}

impl MissedSupport {
    /// Support of the kernel whose release string (`/proc/sys/kernel/osrelease`) is `release`.
    pub fn of_release(release: &str) -> Self {
        let mut numbers = release.split(|c: char| !c.is_ascii_digit()).map(str::parse::<u32>);
        match (numbers.next(), numbers.next()) {
            (Some(Ok(major)), Some(Ok(minor))) if (major, minor) >= MISSED_SINCE => Self::Exposed,
            (Some(Ok(_)), Some(Ok(_))) => Self::NotExposed {
                reason: format!(
                    "Linux {release} does not report missed kprobe hits (bpf_link_info.perf_event.kprobe.missed \
                     appeared in {}.{})",
                    MISSED_SINCE.0, MISSED_SINCE.1
                ),
            },
            _ => Self::NotExposed { reason: format!("kernel release {release:?} not understood") },
        }
    }

    /// Support of the running kernel.
    pub fn running() -> Self {
        match std::fs::read_to_string("/proc/sys/kernel/osrelease") {
            Ok(release) => Self::of_release(release.trim()),
            Err(e) => Self::NotExposed { reason: format!("cannot read /proc/sys/kernel/osrelease: {e}") },
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MissedError {
    #[error("{call}: {cause}")]
    Syscall { call: &'static str, cause: std::io::Error },
}

fn sys_bpf(cmd: bpf_cmd, attr: &mut bpf_attr, call: &'static str) -> Result<i64, MissedError> {
    // SAFETY: `attr` is a valid, zero-initialised `union bpf_attr` of the size passed.
    let ret = unsafe {
        libc::syscall(libc::SYS_bpf, cmd as libc::c_long, attr as *mut bpf_attr, size_of::<bpf_attr>() as libc::c_uint)
    };
    if ret < 0 { Err(MissedError::Syscall { call, cause: std::io::Error::last_os_error() }) } else { Ok(ret) }
}

fn zeroed_attr() -> bpf_attr {
    // SAFETY: `union bpf_attr` is plain integers; all-zero is its "no options" value.
    unsafe { std::mem::zeroed() }
}

/// The id of the link after `start` (0 = the first), `None` after the last.
fn next_link_id(start: u32) -> Result<Option<u32>, MissedError> {
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_6.__bindgen_anon_1.start_id = start;
    match sys_bpf(bpf_cmd::BPF_LINK_GET_NEXT_ID, &mut attr, "BPF_LINK_GET_NEXT_ID") {
        Ok(_) => {
            // SAFETY: the kernel wrote `next_id`.
            Ok(Some(unsafe { attr.__bindgen_anon_6.next_id }))
        }
        Err(MissedError::Syscall { cause, .. }) if cause.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

fn link_fd(id: u32) -> Result<Option<OwnedFd>, MissedError> {
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_6.__bindgen_anon_1.link_id = id;
    match sys_bpf(bpf_cmd::BPF_LINK_GET_FD_BY_ID, &mut attr, "BPF_LINK_GET_FD_BY_ID") {
        // SAFETY: the kernel returned a new fd that nothing else owns.
        Ok(fd) => Ok(Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })),
        // Released between GET_NEXT_ID and now.
        Err(MissedError::Syscall { cause, .. }) if cause.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

fn link_info(fd: &OwnedFd) -> Result<bpf_link_info, MissedError> {
    // SAFETY: plain integers; zero asks the kernel for no names.
    let mut info: bpf_link_info = unsafe { std::mem::zeroed() };
    let mut attr = zeroed_attr();
    attr.info.bpf_fd = fd.as_raw_fd() as u32;
    attr.info.info_len = size_of::<bpf_link_info>() as u32;
    attr.info.info = &mut info as *mut bpf_link_info as u64;
    sys_bpf(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr, "BPF_OBJ_GET_INFO_BY_FD")?;
    Ok(info)
}

/// Missed hits of one kprobe link, if the kernel filled them in.
fn missed_of(info: &bpf_link_info) -> Option<u64> {
    if info.type_ != bpf_link_type::BPF_LINK_TYPE_PERF_EVENT as u32 {
        return None;
    }
    // SAFETY: a perf-event link's info is the `perf_event` member; the kernel sets its `type`
    // (6.6+), and for a kprobe fills the `kprobe` member.
    let perf = unsafe { info.__bindgen_anon_1.perf_event };
    let kprobe = perf.type_ == bpf_perf_event_type::BPF_PERF_EVENT_KPROBE as u32
        || perf.type_ == bpf_perf_event_type::BPF_PERF_EVENT_KRETPROBE as u32;
    if !kprobe {
        return None;
    }
    // SAFETY: as above.
    Some(unsafe { perf.__bindgen_anon_1.kprobe.missed })
}

/// The links of the attached return probes, to ask their missed counts.
#[derive(Debug, Default)]
pub struct ReturnProbeLinks {
    links: Vec<(&'static str, OwnedFd)>,
    support: Option<MissedSupport>,
}

impl ReturnProbeLinks {
    /// Find the links of `programs` (program name, kernel program id) among the system's links.
    /// The fds held keep the links alive as long as this value lives.
    pub fn find(programs: &[(&'static str, u32)], support: MissedSupport) -> Result<Self, MissedError> {
        let mut links = Vec::new();
        let mut id = 0;
        while let Some(next) = next_link_id(id)? {
            id = next;
            let Some(fd) = link_fd(id)? else { continue };
            let info = link_info(&fd)?;
            if let Some((program, _)) = programs.iter().find(|(_, prog_id)| *prog_id == info.prog_id) {
                links.push((*program, fd));
            }
        }
        Ok(Self { links, support: Some(support) })
    }

    /// How many return-probe links were found.
    pub fn len(&self) -> usize {
        self.links.len()
    }

    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// Missed hits per program, or why the kernel cannot tell.
    pub fn missed_by_program(&self) -> Result<Vec<(&'static str, u64)>, String> {
        match &self.support {
            None => return Err("no return probes attached".to_owned()),
            Some(MissedSupport::NotExposed { reason }) => return Err(reason.clone()),
            Some(MissedSupport::Exposed) => {}
        }
        self.links
            .iter()
            .map(|(program, fd)| {
                let info = link_info(fd).map_err(|e| format!("{program}: {e}"))?;
                let missed = missed_of(&info).ok_or_else(|| format!("{program}: the link is not a kprobe link"))?;
                Ok((*program, missed))
            })
            .collect()
    }

    /// Missed hits over every return probe; `None` when the kernel cannot tell.
    pub fn missed(&self) -> Option<u64> {
        match self.missed_by_program() {
            Ok(counts) => Some(counts.iter().map(|(_, n)| n).sum()),
            Err(reason) => {
                log::debug!("missed return probes unknown: {reason}");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_release_decides_whether_missed_hits_are_exposed() {
        assert_eq!(MissedSupport::of_release("6.12.117+deb12-amd64"), MissedSupport::Exposed);
        assert_eq!(MissedSupport::of_release("6.7.0"), MissedSupport::Exposed);
        assert_eq!(
            MissedSupport::of_release("6.1.0-56-amd64"),
            MissedSupport::NotExposed {
                reason: "Linux 6.1.0-56-amd64 does not report missed kprobe hits \
                         (bpf_link_info.perf_event.kprobe.missed appeared in 6.7)"
                    .to_owned()
            }
        );
        assert!(matches!(MissedSupport::of_release("6.6.30"), MissedSupport::NotExposed { .. }));
        assert!(matches!(MissedSupport::of_release("weird"), MissedSupport::NotExposed { .. }));
    }

    #[test]
    fn the_instance_limit_follows_the_possible_cpus() {
        assert_eq!(default_maxactive("0-1\n"), Some(10));
        assert_eq!(default_maxactive("0-7"), Some(16));
        assert_eq!(default_maxactive("0,2-5"), Some(10));
        assert_eq!(default_maxactive("0-63"), Some(128));
        assert_eq!(default_maxactive("x"), None);
    }

    #[test]
    fn missed_is_read_only_from_kprobe_perf_links() {
        // SAFETY: plain integers.
        let mut info: bpf_link_info = unsafe { std::mem::zeroed() };
        assert_eq!(missed_of(&info), None, "link type 0");
        info.type_ = bpf_link_type::BPF_LINK_TYPE_PERF_EVENT as u32;
        assert_eq!(missed_of(&info), None, "6.1: perf-event fields not filled");
        info.__bindgen_anon_1.perf_event.type_ = bpf_perf_event_type::BPF_PERF_EVENT_KRETPROBE as u32;
        info.__bindgen_anon_1.perf_event.__bindgen_anon_1.kprobe.missed = 6;
        assert_eq!(missed_of(&info), Some(6));
        let none = ReturnProbeLinks::default();
        assert_eq!(none.missed(), None);
        let exposed = ReturnProbeLinks { links: Vec::new(), support: Some(MissedSupport::Exposed) };
        assert_eq!(exposed.missed(), Some(0));
    }
}
