//! Which KFD features this driver has, each found by its own sign rather than by the ioctl
//! version number (docs/kfd.md §1.5).
//!
//! AMD's amdgpu-dkms driver numbers its KFD versions differently from upstream: ROCm 7.2's
//! amdgpu 6.16.13 reports 1.18 yet carries commands 0x80-0x85, and ROCm's libhsakmt header calls
//! 1.19 "metadata ring" where upstream 1.19 is `AMDKFD_IOC_CREATE_PROCESS`. So every gate looks
//! for the feature itself: an ioctl handler in `/proc/kallsyms`, a struct member in the module's
//! BTF, or a file in sysfs. The version number is consulted only where no such sign exists, and
//! a [`Detection`] says which sign decided, so `gpreempt doctor` can show it.
//!
//! This module only decides; the caller reads the host ([`Signs`]), so the ABI layer stays free of
//! the tracer's kallsyms and BTF readers.

use std::fmt;

use serde::Serialize;

use super::KfdVersion;

/// Whether `/proc/kallsyms` names a function of the KFD module.
pub type SymbolSign<'a> = &'a dyn Fn(&str) -> bool;
/// Whether the KFD module's BTF has `struct <0>` with a member `<1>`.
pub type BtfMemberSign<'a> = &'a dyn Fn(&str, &str) -> bool;

/// What the host offers to decide a gate: each source `None` when it could not be read.
#[derive(Default)]
pub struct Signs<'a> {
    pub symbol: Option<SymbolSign<'a>>,
    pub btf_member: Option<BtfMemberSign<'a>>,
    /// `AMDKFD_IOC_GET_VERSION` of `/dev/kfd`.
    pub version: Option<KfdVersion>,
    /// The running kernel's release (`/proc/sys/kernel/osrelease`), e.g. `7.3.4+deb13-amd64`.
    pub release: Option<&'a str>,
}

/// The sign that decided a gate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "by", rename_all = "snake_case")]
pub enum FoundBy {
    /// A function of the KFD module in `/proc/kallsyms` (present or absent).
    Symbol { name: &'static str },
    /// A struct member in the KFD module's BTF (present or absent).
    Btf { member: &'static str },
    /// A file or directory in sysfs.
    Sysfs { path: String },
    /// No sign of its own could be read or exists: the KFD ioctl version, which AMD's DKMS driver
    /// numbers differently from upstream.
    VersionFallback { version: KfdVersion },
    /// No sign of its own could be read: the kernel release (upstream numbering only).
    ReleaseFallback { release: String },
    /// Nothing could be read.
    Unknown,
}

impl fmt::Display for FoundBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Symbol { name } => write!(f, "by symbol {name} in /proc/kallsyms"),
            Self::Btf { member } => write!(f, "by BTF member {member}"),
            Self::Sysfs { path } => write!(f, "by sysfs {path}"),
            Self::VersionFallback { version } => write!(f, "by version fallback (KFD {version})"),
            Self::ReleaseFallback { release } => write!(f, "by kernel-release fallback (Linux {release})"),
            Self::Unknown => f.write_str("unknown: neither kallsyms, BTF nor the KFD version could be read"),
        }
    }
}

/// One gate's answer: whether the feature is there (`None`: could not tell) and how that was found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Detection {
    pub present: Option<bool>,
    #[serde(flatten)]
    pub by: FoundBy,
}

impl Detection {
    fn new(present: bool, by: FoundBy) -> Self {
        Self { present: Some(present), by }
    }

    fn unknown() -> Self {
        Self { present: None, by: FoundBy::Unknown }
    }

    /// Present for sure.
    pub fn is_present(&self) -> bool {
        self.present == Some(true)
    }
}

impl fmt::Display for Detection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.present {
            Some(true) => write!(f, "present ({})", self.by),
            Some(false) => write!(f, "absent ({})", self.by),
            None => write!(f, "{}", self.by),
        }
    }
}

/// `kfd_ioctl_set_debug_trap`, the `AMDKFD_IOC_DBG_TRAP` handler (kfd_chardev.c 6.12.117; its
/// address is in the ioctl table, so it always has an out-of-line copy in kallsyms). The same
/// name in AMD's DKMS tree (ROCm/amdgpu kfd_chardev.c, which keeps the pre-upstream
/// `DBG_TRAP_DEPRECATED` at 0x82 beside it).
pub const DEBUG_TRAP_SYMBOL: &str = "kfd_ioctl_set_debug_trap";
/// `kfd_ioctl_create_process`, the `AMDKFD_IOC_CREATE_PROCESS` handler (secondary contexts,
/// upstream v7.0-rc1, series "amdkfd: introduce new ioctl AMDKFD_IOC_CREATE_PROCESS", V7 18/18).
pub const CREATE_PROCESS_SYMBOL: &str = "kfd_ioctl_create_process";
/// `struct kfd_process.context_id` (u16, 0xFFFF = `KFD_CONTEXT_ID_PRIMARY`): added by the same
/// series (kfd_priv.h; at byte 2074 of 2096 in Debian 7.3.4's module BTF).
pub const CONTEXT_ID_MEMBER: (&str, &str) = ("kfd_process", "context_id");

/// The debug-trap API (`AMDKFD_IOC_RUNTIME_ENABLE`, `AMDKFD_IOC_DBG_TRAP`): its handler in
/// kallsyms; else KFD ≥ 1.13, where upstream and DKMS numbering still agree (both put the
/// debugger API at 1.13; they part from 1.19 on).
pub fn debug_trap(signs: &Signs<'_>) -> Detection {
    if let Some(symbol) = signs.symbol {
        return Detection::new(symbol(DEBUG_TRAP_SYMBOL), FoundBy::Symbol { name: DEBUG_TRAP_SYMBOL });
    }
    match signs.version {
        Some(v) => Detection::new(v.has_debug_trap(), FoundBy::VersionFallback { version: v }),
        None => Detection::unknown(),
    }
}

/// Secondary KFD contexts (upstream 7.0): the CREATE_PROCESS handler in kallsyms, else
/// `kfd_process.context_id` in BTF, else upstream's KFD ≥ 1.19 (wrong on ROCm's DKMS numbering,
/// where 1.19 is the metadata ring: said so in the detection).
pub fn secondary_contexts(signs: &Signs<'_>) -> Detection {
    if let Some(symbol) = signs.symbol {
        return Detection::new(symbol(CREATE_PROCESS_SYMBOL), FoundBy::Symbol { name: CREATE_PROCESS_SYMBOL });
    }
    if let Some(member) = signs.btf_member {
        let (strukt, field) = CONTEXT_ID_MEMBER;
        return Detection::new(member(strukt, field), FoundBy::Btf { member: "kfd_process.context_id" });
    }
    match signs.version {
        Some(v) => Detection::new(v.has_secondary_contexts(), FoundBy::VersionFallback { version: v }),
        None => Detection::unknown(),
    }
}

/// gfx12 "expert scheduling" support in the trap handler (upstream KFD 1.20). Version only: the
/// support is inside the trap-handler binary the driver embeds, and the 1.20 bump exists so that
/// "userspace can key off this to decide" (Mario Limonciello, "Fixes: 0f0c8a6983db"); no symbol,
/// member or file marks it.
pub fn expert_sched_trap(signs: &Signs<'_>) -> Detection {
    match signs.version {
        Some(v) => Detection::new(v.has_expert_sched_trap(), FoundBy::VersionFallback { version: v }),
        None => Detection::unknown(),
    }
}

/// Which numbering of the kernel's `enum kfd_queue_type` sysfs prints (`queues/<id>/type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueTypeNumbering {
    /// ≤ 6.19: `COMPUTE 0, SDMA 1, HIQ 2, DIQ 3, SDMA_XGMI 4, SDMA_BY_ENG_ID 5`.
    WithDiq,
    /// ≥ 7.0 ("amdkfd: remove DIQ support", e1b73b64271d, V7 10/18 of the CREATE_PROCESS series):
    /// `COMPUTE 0, SDMA 1, HIQ 2, SDMA_XGMI 3, SDMA_BY_ENG_ID 4`.
    WithoutDiq,
}

/// The queue-type numbering and how it was found. DIQ's removal landed in the same series as
/// secondary contexts (v7.0-rc1), so their signs (the CREATE_PROCESS handler, then
/// `kfd_process.context_id`) stand for it, then the kernel release. The KFD version is not used:
/// DKMS numbers it differently. *(inferred: the enum itself is not in the BTF reader's reach)*
pub fn queue_type_numbering(signs: &Signs<'_>) -> (Option<QueueTypeNumbering>, FoundBy) {
    let numbering = |new: bool| Some(if new { QueueTypeNumbering::WithoutDiq } else { QueueTypeNumbering::WithDiq });
    if let Some(symbol) = signs.symbol {
        return (numbering(symbol(CREATE_PROCESS_SYMBOL)), FoundBy::Symbol { name: CREATE_PROCESS_SYMBOL });
    }
    if let Some(member) = signs.btf_member {
        let (strukt, field) = CONTEXT_ID_MEMBER;
        return (numbering(member(strukt, field)), FoundBy::Btf { member: "kfd_process.context_id" });
    }
    match signs.release.and_then(release_major_minor) {
        Some((major, minor)) => {
            let release = signs.release.unwrap_or_default().to_owned();
            (numbering((major, minor) >= (7, 0)), FoundBy::ReleaseFallback { release })
        }
        None => (None, FoundBy::Unknown),
    }
}

/// `7.3.4+deb13-amd64` → (7, 3).
fn release_major_minor(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_17: KfdVersion = KfdVersion { major: 1, minor: 17 };
    const V1_18: KfdVersion = KfdVersion { major: 1, minor: 18 };
    const V1_20: KfdVersion = KfdVersion { major: 1, minor: 20 };

    /// ROCm 7.2's amdgpu-dkms 6.16.13: reports 1.18, has the debug trap, no CREATE_PROCESS.
    #[test]
    fn a_symbol_decides_over_the_version() {
        let has = |name: &str| name == DEBUG_TRAP_SYMBOL;
        let signs = Signs { symbol: Some(&has), version: Some(V1_18), ..Signs::default() };
        assert_eq!(debug_trap(&signs), Detection::new(true, FoundBy::Symbol { name: "kfd_ioctl_set_debug_trap" }));
        assert_eq!(
            secondary_contexts(&signs),
            Detection::new(false, FoundBy::Symbol { name: "kfd_ioctl_create_process" })
        );
        assert_eq!(
            secondary_contexts(&signs).to_string(),
            "absent (by symbol kfd_ioctl_create_process in /proc/kallsyms)"
        );
        // A DKMS that numbers like ROCm's libhsakmt header (1.19-1.22 = metadata ring etc.) and
        // has no CREATE_PROCESS: the symbol says no, whatever the number.
        let signs = Signs { symbol: Some(&has), version: Some(KfdVersion { major: 1, minor: 22 }), ..Signs::default() };
        assert!(!secondary_contexts(&signs).is_present());
    }

    #[test]
    fn btf_then_version_when_kallsyms_is_unreadable() {
        let member = |s: &str, m: &str| (s, m) == ("kfd_process", "context_id");
        let signs = Signs { btf_member: Some(&member), version: Some(V1_17), ..Signs::default() };
        assert_eq!(secondary_contexts(&signs), Detection::new(true, FoundBy::Btf { member: "kfd_process.context_id" }));
        let signs = Signs { version: Some(V1_20), ..Signs::default() };
        assert_eq!(secondary_contexts(&signs), Detection::new(true, FoundBy::VersionFallback { version: V1_20 }));
        assert_eq!(secondary_contexts(&signs).to_string(), "present (by version fallback (KFD 1.20))");
        assert_eq!(debug_trap(&signs), Detection::new(true, FoundBy::VersionFallback { version: V1_20 }));
        assert_eq!(secondary_contexts(&Signs::default()), Detection::unknown());
        assert_eq!(debug_trap(&Signs::default()).present, None);
    }

    #[test]
    fn expert_scheduling_has_only_the_version() {
        let has = |_: &str| true;
        let signs = Signs { symbol: Some(&has), version: Some(V1_17), ..Signs::default() };
        assert_eq!(expert_sched_trap(&signs), Detection::new(false, FoundBy::VersionFallback { version: V1_17 }));
        let signs = Signs { version: Some(V1_20), ..Signs::default() };
        assert!(expert_sched_trap(&signs).is_present());
        assert_eq!(expert_sched_trap(&Signs::default()), Detection::unknown());
    }

    #[test]
    fn queue_type_numbering_by_symbol_btf_then_release() {
        let none = |_: &str| false;
        let signs = Signs { symbol: Some(&none), release: Some("7.3.4+deb13-amd64"), ..Signs::default() };
        assert_eq!(
            queue_type_numbering(&signs),
            (Some(QueueTypeNumbering::WithDiq), FoundBy::Symbol { name: "kfd_ioctl_create_process" })
        );
        let member = |_: &str, _: &str| true;
        let signs = Signs { btf_member: Some(&member), ..Signs::default() };
        assert_eq!(
            queue_type_numbering(&signs),
            (Some(QueueTypeNumbering::WithoutDiq), FoundBy::Btf { member: "kfd_process.context_id" })
        );
        for (release, numbering) in [
            ("6.12.117+deb12-amd64", QueueTypeNumbering::WithDiq),
            ("6.19.2", QueueTypeNumbering::WithDiq),
            ("7.0.0-rc1", QueueTypeNumbering::WithoutDiq),
            ("7.3.4+deb13-amd64", QueueTypeNumbering::WithoutDiq),
        ] {
            let signs = Signs { release: Some(release), ..Signs::default() };
            assert_eq!(
                queue_type_numbering(&signs),
                (Some(numbering), FoundBy::ReleaseFallback { release: release.to_owned() }),
                "{release}"
            );
        }
        assert_eq!(queue_type_numbering(&Signs::default()), (None, FoundBy::Unknown));
    }

    #[test]
    fn detections_serialise_with_their_sign() {
        let d = Detection::new(true, FoundBy::Symbol { name: "kfd_ioctl_create_process" });
        assert_eq!(
            serde_json::to_value(&d).unwrap(),
            serde_json::json!({"present": true, "by": "symbol", "name": "kfd_ioctl_create_process"})
        );
        let d = Detection::new(false, FoundBy::VersionFallback { version: V1_17 });
        assert_eq!(
            serde_json::to_value(&d).unwrap(),
            serde_json::json!({"present": false, "by": "version_fallback", "version": {"major": 1, "minor": 17}})
        );
    }
}
