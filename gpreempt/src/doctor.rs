//! `gpreempt doctor`: what this host offers gpreempt, and what to do about each gap.
//!
//! Every check is a typed [`Check`] (status, what was found, the fix); the binary prints them as
//! text or JSON. Reading only: nothing is attached and nothing is changed, except that the KFD
//! version is asked by opening `/dev/kfd` (which registers a short-lived KFD process).

use std::{collections::BTreeMap, fs, path::Path};

use serde::Serialize;

use crate::{
    deploy::{AGENT_NEEDS, AgentNeeds, Need},
    host::{self, partition::Partitions, procinfo::effective_caps, roots::Roots, topology::GpuNode},
    kfd::{
        Device, KfdVersion,
        device::DeviceError,
        features::{self, Detection, FoundBy, QueueTypeNumbering, Signs},
    },
    trace::{
        btf::Btf,
        missed::{self, MissedSupport},
        probes::{self, ResolvedProbe},
        symbols::Kallsyms,
    },
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
    Info,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub detail: String,
    /// What to do, for Warn and Fail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    fn new(name: &str, status: Status, detail: impl Into<String>, fix: Option<&str>) -> Self {
        Self { name: name.to_owned(), status, detail: detail.into(), fix: fix.map(str::to_owned) }
    }
}

/// Everything doctor found.
#[derive(Clone, Debug, Serialize)]
pub struct DoctorReport {
    pub kernel: String,
    pub kfd_version: Option<KfdVersion>,
    pub debug_trap: bool,
    pub kfd_module: Option<String>,
    /// Each KFD feature gate and the sign that decided it (docs/kfd.md §1.5).
    pub features: KfdFeatures,
    pub probes: Vec<ResolvedProbe>,
    pub checks: Vec<Check>,
    /// What `gpreempt agent` needs from this host (the same on every host).
    pub agent_needs: AgentNeeds,
}

/// The KFD feature gates as this host answers them, each with how it was found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KfdFeatures {
    pub debug_trap: Detection,
    pub secondary_contexts: Detection,
    pub expert_sched_trap: Detection,
    /// Which `enum kfd_queue_type` numbering sysfs `queues/<id>/type` uses.
    pub queue_types: Option<QueueTypeNumbering>,
    pub queue_types_by: FoundBy,
}

impl KfdFeatures {
    /// From kallsyms (the KFD module's functions), the module's BTF, the KFD version and the
    /// kernel release, whichever could be read.
    fn detect(kallsyms: Option<&Kallsyms>, btf: Option<&Btf>, version: Option<KfdVersion>, release: &str) -> Self {
        // Kallsyms counts only where it names the KFD module: otherwise every symbol is absent.
        let module = kallsyms.and_then(|k| k.kfd_module().map(|m| (k, m)));
        let symbol = module.map(|(k, m)| move |name: &str| k.resolve(name, m).is_some());
        let member = btf.map(|b| move |strukt: &str, field: &str| b.member_offset(strukt, field).is_some());
        let signs = Signs {
            symbol: symbol.as_ref().map(|f| f as &dyn Fn(&str) -> bool),
            btf_member: member.as_ref().map(|f| f as &dyn Fn(&str, &str) -> bool),
            version,
            release: (release != "unknown").then_some(release),
        };
        let (queue_types, queue_types_by) = features::queue_type_numbering(&signs);
        Self {
            debug_trap: features::debug_trap(&signs),
            secondary_contexts: features::secondary_contexts(&signs),
            expert_sched_trap: features::expert_sched_trap(&signs),
            queue_types,
            queue_types_by,
        }
    }
}

impl DoctorReport {
    pub fn failures(&self) -> usize {
        self.checks.iter().filter(|c| c.status == Status::Fail).count()
    }
}

fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

/// Module BTF (`/sys/kernel/btf/<module>`, CONFIG_DEBUG_INFO_BTF_MODULES) appeared in Linux 5.11.
const MODULE_BTF_SINCE: (u32, u32) = (5, 11);

/// The bits of the capabilities [`AGENT_NEEDS`] names (linux/capability.h).
const CAP_BITS: [(&str, u32); 6] = [
    ("CAP_IPC_LOCK", 14),
    ("CAP_SYS_PTRACE", 19),
    ("CAP_SYS_NICE", 23),
    ("CAP_SYSLOG", 34),
    ("CAP_PERFMON", 38),
    ("CAP_BPF", 39),
];

/// Run every check. `kfd` is the KFD version if known (None: ask `/dev/kfd`).
pub fn diagnose(roots: &Roots, kallsyms: Option<&Kallsyms>, kfd: Option<KfdVersion>) -> DoctorReport {
    let opened = match kfd {
        Some(v) => Ok(v),
        None => Device::open().and_then(|d| d.version()),
    };
    diagnose_opened(roots, kallsyms, opened)
}

/// Like [`diagnose`], with the result of opening `/dev/kfd` and asking its version given: the
/// facts read once, then each check's rows in the report's order.
pub fn diagnose_opened(
    roots: &Roots,
    kallsyms: Option<&Kallsyms>,
    opened: Result<KfdVersion, DeviceError>,
) -> DoctorReport {
    let kernel = read_trimmed(&roots.proc.join("sys/kernel/osrelease")).unwrap_or_else(|| "unknown".to_owned());
    let kfd_loaded = kallsyms.and_then(Kallsyms::kfd_module).is_some();
    // Without the module every check of the driver would fail on its own and send the user to
    // modprobe several times over: one line says it, and those checks are skipped.
    let amdgpu_loaded =
        kfd_loaded || !matches!(opened, Err(DeviceError::Missing)) || roots.sys.join("module/amdgpu").exists();
    // KFD ioctl version: GET_VERSION on /dev/kfd.
    let kfd_version = opened.as_ref().ok().copied();
    let params = roots.sys.join("module/amdgpu/parameters");
    let param = |name: &str| read_trimmed(&params.join(name));
    let sched_policy = param("sched_policy");
    let debug_trap = kfd_version.is_some_and(KfdVersion::has_debug_trap) && sched_policy.as_deref() != Some("2");
    // Which module provides KFD.
    let kfd_module = kallsyms.and_then(Kallsyms::kfd_module).map(|m| m.unwrap_or("vmlinux").to_owned());
    // The tracer's probes, where a module provides KFD (else see `probes_unchecked_check`).
    let probes = match (kallsyms, &kfd_module) {
        (Some(k), Some(_)) => probes::resolve(probes::PROBES, k, kfd_version, Some(&kernel)),
        _ => Vec::new(),
    };
    let gpus = host::topology::gpu_nodes(&roots.sys).unwrap_or_default();
    // The KFD module's BTF (vmlinux's when KFD is built in), for the features' BTF signs.
    let btf = kfd_module
        .as_deref()
        .and_then(|m| Btf::load(&roots.sys.join("kernel/btf"), (m != "vmlinux").then_some(m)).ok());
    let features = KfdFeatures::detect(kallsyms, btf.as_ref(), kfd_version, &kernel);

    let mut checks = vec![kernel_check(&kernel)];
    if amdgpu_loaded {
        checks.push(kfd_check(roots, kfd_loaded, &opened));
        checks.push(debug_trap_check(kallsyms, kfd_version, sched_policy.as_deref()));
    } else {
        checks.push(amdgpu_check());
    }
    if amdgpu_loaded {
        checks.push(features_check(&features));
    }
    checks.extend(kfd_contexts_check(&features.secondary_contexts));
    checks.extend(expert_scheduling_check(&gpus, &features.expert_sched_trap));
    checks.extend(partitions_check(&Partitions::of(&roots.sys, &gpus)));
    checks.extend(per_queue_reset_check(&gpus));
    checks.extend(cwsr_size_check(&gpus));
    if amdgpu_loaded {
        checks.push(kfd_module_check(kfd_module.as_deref(), kallsyms.is_some()));
        if let Some(m) = &kfd_module {
            checks.push(module_btf_check(roots, &kernel, m));
        } else if kallsyms.is_some() {
            checks.push(probes_unchecked_check());
        }
    }
    checks.extend(probes.iter().map(probe_check));
    checks.push(return_probe_losses(roots, &kernel));
    if amdgpu_loaded {
        checks.push(debugfs_check(roots));
    }
    checks.push(ptrace_scope_check(roots));
    checks.push(capabilities_check(roots));
    checks.push(perf_event_paranoid_check(roots));
    if amdgpu_loaded {
        checks.extend(AMDGPU_PARAMS.iter().map(|&(name, good, fix)| amdgpu_param_check(name, param(name), good, fix)));
    }
    checks.push(agent_needs_check());
    DoctorReport { kernel, kfd_version, debug_trap, kfd_module, features, probes, checks, agent_needs: AGENT_NEEDS }
}

fn kernel_check(kernel: &str) -> Check {
    Check::new("kernel", Status::Info, format!("Linux {kernel}"), None)
}

/// The one line that replaces the driver's checks when amdgpu is not loaded.
fn amdgpu_check() -> Check {
    Check::new(
        "amdgpu",
        Status::Fail,
        "amdgpu is not loaded (no /dev/kfd, no KFD function in the kernel, no /sys/module/amdgpu): the checks of \
         the driver (KFD version, debug-trap, probes, debugfs, module parameters) are skipped",
        Some("`modprobe amdgpu` on a host with an AMD GPU, then run `gpreempt doctor` again"),
    )
}

/// GPU nodes of the KFD topology (`gpu_id` ≠ 0; CPU nodes have 0), None when it is not readable.
fn topology_gpus(roots: &Roots) -> Option<usize> {
    let nodes = fs::read_dir(roots.sys.join("class/kfd/kfd/topology/nodes")).ok()?;
    Some(
        nodes
            .filter_map(Result::ok)
            .filter_map(|n| read_trimmed(&n.path().join("gpu_id")))
            .filter(|id| id.parse::<u64>().is_ok_and(|id| id != 0))
            .count(),
    )
}

/// The `kfd` check from what opening `/dev/kfd` and GET_VERSION gave.
fn kfd_check(roots: &Roots, kfd_loaded: bool, opened: &Result<KfdVersion, DeviceError>) -> Check {
    let einval = matches!(opened, Err(DeviceError::Open(e)) if e.raw_os_error() == Some(libc::EINVAL));
    match opened {
        Ok(v) => Check::new("kfd", Status::Ok, format!("KFD ioctl interface {v}"), None),
        // docs/kfd.md §1.3: on KFD 1.19+ (Debian 7.3.4: KFD 1.23) kfd_open() creates the KFD process
        // at once and refuses with EINVAL ("no gpu node! Cannot create KFD process" in dmesg) when
        // the topology has no GPU; 6.12.117 (KFD 1.17) opened it without one.
        Err(_) if einval && kfd_loaded && topology_gpus(roots) == Some(0) => Check::new(
            "kfd",
            Status::Fail,
            "the KFD driver is loaded but has no GPU: open(/dev/kfd) fails with EINVAL (KFD ≥ 1.19 creates \
             the KFD process at open and refuses it without a GPU node; the topology lists none), so the KFD \
             version cannot be asked",
            Some(
                "nothing to load or fix: this host has no GPU the driver manages; `gpreempt trace` still \
                  attaches, the controller needs a GPU",
            ),
        ),
        Err(DeviceError::Missing) if kfd_loaded => Check::new(
            "kfd",
            Status::Fail,
            "the KFD functions are loaded but /dev/kfd does not exist",
            Some("check udev and the kernel log: the driver failed to create its device node"),
        ),
        Err(e @ DeviceError::Missing) => {
            Check::new("kfd", Status::Fail, e.to_string(), Some("load the driver: `modprobe amdgpu`"))
        }
        Err(e @ DeviceError::PermissionDenied) => {
            Check::new("kfd", Status::Fail, e.to_string(), Some("run as root or a member of the `render` group"))
        }
        Err(e) => Check::new(
            "kfd",
            Status::Fail,
            format!("/dev/kfd cannot be used: {e}"),
            Some("see the kernel log (`dmesg | grep -i kfd`)"),
        ),
    }
}

/// Whether suspend/resume is there: the KFD version and amdgpu's `sched_policy`, or without the
/// version the driver's own symbols.
fn debug_trap_check(kallsyms: Option<&Kallsyms>, kfd: Option<KfdVersion>, sched_policy: Option<&str>) -> Check {
    match (kfd, sched_policy) {
        (Some(v), _) if !v.has_debug_trap() => Check::new(
            "debug-trap",
            Status::Warn,
            format!("absent: needs KFD ≥ {}, this kernel has {v}", KfdVersion::DEBUG_TRAP),
            Some("suspend/resume needs Linux 6.5+ or AMD's amdgpu-dkms driver; tracing works regardless"),
        ),
        (Some(_), Some("2")) => Check::new(
            "debug-trap",
            Status::Warn,
            "present but unusable: amdgpu sched_policy=2 (no HWS) makes every debug-trap call fail with EINVAL",
            Some("load amdgpu with sched_policy=0"),
        ),
        (Some(v), _) => Check::new("debug-trap", Status::Ok, format!("available (KFD {v} ≥ 1.13)"), None),
        // Without the version, the driver's own symbols still say whether the API exists.
        (None, _) => match kallsyms.map(|k| k.resolve("kfd_ioctl_set_debug_trap", k.kfd_module().flatten())) {
            Some(Some(_)) => Check::new(
                "debug-trap",
                Status::Warn,
                "present in the driver (kfd_ioctl_set_debug_trap is loaded) but not usable: /dev/kfd cannot be opened",
                None,
            ),
            Some(None) => Check::new(
                "debug-trap",
                Status::Warn,
                "absent: the driver has no kfd_ioctl_set_debug_trap (KFD < 1.13)",
                None,
            ),
            None => Check::new("debug-trap", Status::Warn, "unknown: KFD version not readable", None),
        },
    }
}

/// How each KFD feature gate was decided on this host: by its own sign (a symbol, a BTF member,
/// a sysfs file) or by the version fallback (docs/kfd.md §1.5).
fn features_check(f: &KfdFeatures) -> Check {
    let numbering = match f.queue_types {
        Some(QueueTypeNumbering::WithDiq) => "with DIQ (≤ 6.19: SDMA_XGMI 4)",
        Some(QueueTypeNumbering::WithoutDiq) => "without DIQ (7.0+: SDMA_XGMI 3)",
        None => "unknown",
    };
    Check::new(
        "kfd-features",
        Status::Info,
        format!(
            "debug trap {}; secondary contexts {}; gfx12 expert-scheduling trap handler {}; sysfs queue types {} ({})",
            f.debug_trap, f.secondary_contexts, f.expert_sched_trap, numbering, f.queue_types_by
        ),
        None,
    )
}

/// Secondary KFD contexts (Linux 7.0), which the debug trap does not reach (docs/kfd.md §1.4).
fn kfd_contexts_check(contexts: &Detection) -> Option<Check> {
    contexts.is_present().then(|| {
        Check::new(
            "kfd-contexts",
            Status::Info,
            format!(
                "secondary KFD contexts {contexts}: a process may own several (AMDKFD_IOC_CREATE_PROCESS), and \
                 DBG_TRAP answers EOPNOTSUPP for a secondary one; gpreempt refuses a process that has any \
                 (sysfs proc/<pid>/context_<id>/), and schedules one with only extra /dev/kfd files normally"
            ),
            None,
        )
    })
}

/// gfx12 GPUs under a trap handler without expert-scheduling support (docs/kfd.md §1.4).
fn expert_scheduling_check(gpus: &[GpuNode], expert: &Detection) -> Option<Check> {
    let gfx12: Vec<String> = gpus.iter().filter(|g| g.is_gfx12()).map(|g| format!("{:#x}", g.gpu_id.0)).collect();
    (expert.present == Some(false) && !gfx12.is_empty()).then(|| {
        Check::new(
            "expert-scheduling",
            Status::Warn,
            format!(
                "gfx12 GPU(s) {}: the trap handler lacks expert-scheduling support ({expert}; upstream KFD {}), \
                 and suspending queues running such kernels corrupts their waves",
                gfx12.join(", "),
                KfdVersion::EXPERT_SCHED_TRAP
            ),
            Some("do not suspend processes on these GPUs; use a driver with KFD ≥ 1.20"),
        )
    })
}

/// Each package's KFD nodes (its partitions) and mode, as users name them: a SUSPEND unmaps the
/// queues of its own partition only (one HWS runlist per KFD node, Linux 6.5), so the other
/// partitions of a package are never collateral.
fn partitions_check(partitions: &Partitions) -> Option<Check> {
    let mut packages: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    for (gpu, p) in partitions.iter() {
        let mode = p.mode.map_or_else(|| "mode unknown".to_owned(), |m| m.name().to_owned());
        let entry = packages.entry(p.package.to_string()).or_insert_with(|| (mode, Vec::new()));
        entry.1.push(format!("{:#x} #{}", gpu.0, p.index));
    }
    (!packages.is_empty()).then(|| {
        let rows: Vec<String> = packages
            .iter()
            .map(|(package, (mode, gpus))| {
                format!("{package} {mode}, {} KFD node(s): gpu {}", gpus.len(), gpus.join(", "))
            })
            .collect();
        Check::new(
            "gpu-partitions",
            Status::Info,
            format!(
                "GPU packages by PCI address, their compute partition mode and partitions (gpu_id #index): {}; \
                 a suspend preempts the queues of its own partition only",
                rows.join("; ")
            ),
            None,
        )
    })
}

/// Per-queue reset (`HSA_CAP_PER_QUEUE_RESET_SUPPORTED` in a node's `capability`, gfx9 since
/// 6.12): a preemption timeout resets the hung queue, which the controller reports as gone.
fn per_queue_reset_check(gpus: &[GpuNode]) -> Option<Check> {
    let rows: Vec<String> = gpus
        .iter()
        .filter_map(|g| {
            let yes = g.per_queue_reset()?;
            Some(format!("gpu {:#x} {}", g.gpu_id.0, if yes { "yes" } else { "no" }))
        })
        .collect();
    (!rows.is_empty()).then(|| {
        Check::new(
            "per-queue-reset",
            Status::Info,
            format!(
                "a preemption timeout resets only the hung queue (by sysfs topology capability bit 31): {}; \
                 elsewhere it resets the GPU",
                rows.join("; ")
            ),
            None,
        )
    })
}

/// The save area a suspend may fill per queue, where the topology exports `cwsr_size`
/// (6.18.4+/6.19): (cwsr_size + debug area) × num_xcc, page-aligned — sysfs's figure is per XCC
/// (docs/kfd.md §4.4).
fn cwsr_size_check(gpus: &[GpuNode]) -> Option<Check> {
    let sized: Vec<String> = gpus
        .iter()
        .filter_map(|g| {
            let cwsr = g.cwsr_size?;
            let ctl = g.ctl_stack_size.unwrap_or(0);
            Some(match (g.save_area(), g.shape.num_xcc) {
                (Some(total), Some(xcc)) => format!(
                    "gpu {:#x} {total} B per queue ({xcc} XCC × (cwsr_size {cwsr} B + debug area), control stack \
                     {ctl} B per XCC)",
                    g.gpu_id.0
                ),
                _ => format!(
                    "gpu {:#x} cwsr_size {cwsr} B per XCC (control stack {ctl} B); per queue × the XCC count, \
                     which the topology does not give",
                    g.gpu_id.0
                ),
            })
        })
        .collect();
    (!sized.is_empty()).then(|| {
        Check::new(
            "cwsr-size",
            Status::Info,
            format!("context-save area per suspended queue: {}", sized.join("; ")),
            None,
        )
    })
}

/// Which module provides KFD (`kfd_module`), when kallsyms was readable (`kallsyms_read`).
fn kfd_module_check(kfd_module: Option<&str>, kallsyms_read: bool) -> Check {
    match (kfd_module, kallsyms_read) {
        (Some(m), _) => Check::new("kfd-module", Status::Ok, format!("KFD functions are in [{m}]"), None),
        (None, true) => Check::new(
            "kfd-module",
            Status::Fail,
            "no KFD functions in /proc/kallsyms",
            Some("load the driver: `modprobe amdgpu`"),
        ),
        (None, false) => Check::new(
            "kfd-module",
            Status::Warn,
            "/proc/kallsyms not readable",
            Some("run as root to see kernel symbols"),
        ),
    }
}

/// The BTF of the module that provides KFD: the probes' struct offsets.
fn module_btf_check(roots: &Roots, kernel: &str, module: &str) -> Check {
    let btf = roots.sys.join("kernel/btf").join(module);
    let linux = probes::release_version(kernel);
    if btf.exists() {
        Check::new("module-btf", Status::Ok, format!("{} present", btf.display()), None)
    } else if linux.is_some_and(|v| v < MODULE_BTF_SINCE) {
        Check::new(
            "module-btf",
            Status::Warn,
            format!(
                "{} missing: Linux {kernel} loads no module BTF (CONFIG_DEBUG_INFO_BTF_MODULES appeared in {}.{})",
                btf.display(),
                MODULE_BTF_SINCE.0,
                MODULE_BTF_SINCE.1
            ),
            Some("the tracer learns kfd_process pointers from the processes that open /dev/kfd instead"),
        )
    } else {
        Check::new(
            "module-btf",
            Status::Warn,
            format!("{} missing (common with amdgpu-dkms)", btf.display()),
            Some(
                "the tracer falls back to pointer learning; install a kernel with CONFIG_DEBUG_INFO_BTF_MODULES for struct offsets",
            ),
        )
    }
}

/// Without a KFD provider every probe would be "missing": one line says why none was checked.
fn probes_unchecked_check() -> Check {
    Check::new("probes", Status::Info, "not checked: no KFD module loaded", None)
}

/// One probe of the tracer's table on this kernel.
fn probe_check(p: &ResolvedProbe) -> Check {
    let name = format!("probe {}", p.program);
    match (&p.symbol, p.required) {
        (Some(sym), _) => Check::new(&name, Status::Ok, format!("{:?} on {sym}", p.kind), None),
        (None, true) => Check::new(
            &name,
            Status::Fail,
            p.missing_reason.clone().unwrap_or_default(),
            Some("the tracer cannot start; report this kernel build"),
        ),
        (None, false) => Check::new(&name, Status::Warn, p.missing_reason.clone().unwrap_or_default(), None),
    }
}

/// Whether the losses of return probes on sleeping functions (more concurrent callers than the
/// kretprobe instance limit) can be counted on this kernel (`trace::missed`).
fn return_probe_losses(roots: &Roots, kernel: &str) -> Check {
    let limit = read_trimmed(&roots.sys.join("devices/system/cpu/possible"))
        .and_then(|cpus| missed::default_maxactive(&cpus))
        .map_or_else(|| "max(10, 2 × possible CPUs)".to_owned(), |n| n.to_string());
    match MissedSupport::of_release(kernel) {
        MissedSupport::Exposed => Check::new(
            "return-probe-losses",
            Status::Ok,
            format!(
                "counted: each return probe holds {limit} concurrent calls; calls beyond that lose their return \
                 record and are reported as missed in the summary"
            ),
            None,
        ),
        MissedSupport::NotExposed { reason } => Check::new(
            "return-probe-losses",
            Status::Warn,
            format!(
                "not counted: {reason}; each return probe holds {limit} concurrent calls, and a call beyond that \
                 (callers sleeping in amdkfd_fence_wait_timeout or kfd_ioctl_runtime_enable) loses its return record \
                 silently"
            ),
            Some("use Linux 6.7 or newer to have these losses counted; the summary shows them as unknown"),
        ),
    }
}

/// KFD's debugfs files (`ps --hw`).
fn debugfs_check(roots: &Roots) -> Check {
    if roots.debugfs_kfd.join("mqds").exists() {
        Check::new("debugfs", Status::Ok, format!("{} readable", roots.debugfs_kfd.display()), None)
    } else {
        Check::new(
            "debugfs",
            Status::Warn,
            format!("{} not found", roots.debugfs_kfd.display()),
            Some("mount debugfs (`mount -t debugfs none /sys/kernel/debug`) for `ps --hw`"),
        )
    }
}

/// Whether Yama lets the controller's ptrace attach.
fn ptrace_scope_check(roots: &Roots) -> Check {
    match read_trimmed(&roots.proc.join("sys/kernel/yama/ptrace_scope")).as_deref() {
        None => Check::new("ptrace-scope", Status::Info, "Yama not active", None),
        Some("0") | Some("1") => {
            Check::new("ptrace-scope", Status::Ok, "Yama ptrace_scope allows a privileged tracer", None)
        }
        Some("2") => Check::new(
            "ptrace-scope",
            Status::Warn,
            "Yama ptrace_scope=2: only CAP_SYS_PTRACE may attach",
            Some("run gpreempt as root (it has CAP_SYS_PTRACE)"),
        ),
        Some(other) => Check::new(
            "ptrace-scope",
            Status::Fail,
            format!("Yama ptrace_scope={other}: ptrace attach is disabled until reboot"),
            Some("the controller cannot work on this boot; set kernel.yama.ptrace_scope=1 at boot"),
        ),
    }
}

/// This process's effective capabilities against the ones gpreempt uses ([`capability_check`]).
fn capabilities_check(roots: &Roots) -> Check {
    let caps = read_trimmed(&roots.proc.join("self/status")).as_deref().and_then(effective_caps).unwrap_or(0);
    capability_check(caps)
}

/// The effective capability mask `caps` against exactly those of `agent-needs` ([`AGENT_NEEDS`]):
/// what the agent is granted in its unit and its DaemonSet is enough here. CAP_SYS_ADMIN is not
/// asked for: only Debian's and Ubuntu's `perf_event_paranoid` above 2 wants it, which
/// [`perf_event_paranoid_check`] says.
fn capability_check(caps: u64) -> Check {
    let held = |name: &str| CAP_BITS.iter().find(|(n, _)| *n == name).is_some_and(|(_, bit)| caps & (1 << bit) != 0);
    let needed: Vec<&str> = AGENT_NEEDS.capabilities.iter().map(|n| n.name).collect();
    let missing: Vec<&str> = needed.iter().copied().filter(|n| !held(n)).collect();
    if missing.is_empty() {
        Check::new("capabilities", Status::Ok, needed.join(", "), None)
    } else {
        Check::new(
            "capabilities",
            Status::Warn,
            format!("missing {}", missing.join(", ")),
            Some("run gpreempt as root (sudo); a service needs those of agent-needs"),
        )
    }
}

/// Debian's and Ubuntu's kernels: above 2, perf_event_open(2) needs CAP_SYS_ADMIN (trace::loader).
fn perf_event_paranoid_check(roots: &Roots) -> Check {
    let paranoid = read_trimmed(&roots.proc.join("sys/kernel/perf_event_paranoid"));
    match paranoid.as_deref().map(str::parse::<i32>) {
        Some(Ok(level)) if level > 2 => Check::new(
            "perf-event-paranoid",
            Status::Warn,
            format!(
                "kernel.perf_event_paranoid={level}: Debian's and Ubuntu's kernels then attach kprobes only with \
                 CAP_SYS_ADMIN; gpreempt as root works, the agent with only the capabilities of agent-needs \
                 (DaemonSet, systemd unit) cannot"
            ),
            Some("sysctl -w kernel.perf_event_paranoid=2, and keep it in /etc/sysctl.d"),
        ),
        Some(Ok(level)) => Check::new(
            "perf-event-paranoid",
            Status::Ok,
            format!("kernel.perf_event_paranoid={level}: CAP_PERFMON is enough to attach kprobes"),
            None,
        ),
        _ => Check::new("perf-event-paranoid", Status::Info, "not readable", None),
    }
}

/// amdgpu's module parameters doctor shows: the name, the value gpreempt wants (`None`: any,
/// shown for information) and the fix when it differs.
const AMDGPU_PARAMS: [(&str, Option<&str>, &str); 5] = [
    (
        "cwsr_enable",
        Some("1"),
        "CWSR off: preemption waits for waves to drain and long kernels hit the timeout; load amdgpu with cwsr_enable=1",
    ),
    ("sched_policy", None, ""),
    ("mes", None, ""),
    ("queue_preemption_timeout_ms", None, ""),
    ("hws_max_conc_proc", None, ""),
];

/// One of [`AMDGPU_PARAMS`] with its `value` as sysfs gives it.
fn amdgpu_param_check(name: &str, value: Option<String>, good: Option<&str>, fix: &str) -> Check {
    let check_name = format!("amdgpu.{name}");
    match (value, good) {
        (None, _) => Check::new(&check_name, Status::Info, "not readable", None),
        (Some(v), Some(good)) if v != good => Check::new(&check_name, Status::Warn, v, Some(fix)),
        (Some(v), _) => Check::new(&check_name, Status::Info, v, None),
    }
}

/// What the agent needs from any host ([`AGENT_NEEDS`]), for whoever deploys it.
fn agent_needs_check() -> Check {
    let names = |needs: &[Need]| needs.iter().map(|n| n.name).collect::<Vec<_>>().join(", ");
    Check::new(
        "agent-needs",
        Status::Info,
        format!(
            "gpreempt agent needs {}; reads {}; opens {}",
            names(AGENT_NEEDS.capabilities),
            names(AGENT_NEEDS.paths),
            names(AGENT_NEEDS.devices)
        ),
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::FakeHost;

    fn tree() -> FakeHost {
        let mut host = FakeHost::new();
        host.file("proc/sys/kernel/osrelease", "6.1.0-56-amd64\n")
            .file("proc/sys/kernel/yama/ptrace_scope", "3\n")
            .file("proc/self/status", "Name:\tx\nCapEff:\t0000000000080000\n")
            .file("proc/sys/kernel/perf_event_paranoid", "3\n")
            .file("sys/module/amdgpu/parameters/cwsr_enable", "0\n")
            .file("sys/module/amdgpu/parameters/sched_policy", "0\n")
            .file("sys/devices/system/cpu/possible", "0-7\n");
        host
    }

    /// The tree's `sys` and `proc`, and an empty debugfs in it.
    fn roots(host: &FakeHost) -> Roots {
        Roots { debugfs_kfd: host.path().join("debugfs"), ..host.roots() }
    }

    /// A host where the checks find what gpreempt wants: Yama 1, every capability,
    /// perf_event_paranoid 2, amdgpu's module BTF and parameters, debugfs, one gfx90a GPU.
    fn good_tree() -> FakeHost {
        let mut host = tree();
        host.file("proc/sys/kernel/osrelease", "6.12.117+deb12-amd64\n")
            .file("proc/sys/kernel/yama/ptrace_scope", "1\n")
            .file("proc/self/status", "Name:\tx\nCapEff:\t000001ffffffffff\n")
            .file("proc/sys/kernel/perf_event_paranoid", "2\n")
            .file("sys/module/amdgpu/parameters/cwsr_enable", "1\n")
            .file("sys/module/amdgpu/parameters/mes", "0\n")
            .file("sys/module/amdgpu/parameters/queue_preemption_timeout_ms", "9000\n")
            .file("sys/module/amdgpu/parameters/hws_max_conc_proc", "8\n")
            .file("sys/kernel/btf/amdgpu", "")
            .file("sys/class/kfd/kfd/topology/nodes/0/gpu_id", "0\n")
            .file("sys/class/kfd/kfd/topology/nodes/1/gpu_id", "43981\n")
            .file(
                "sys/class/kfd/kfd/topology/nodes/1/properties",
                "gfx_target_version 90010\ncwsr_size 1961984\nctl_stack_size 28672\n",
            )
            .file("debugfs/mqds", "");
        host
    }

    fn fixture(release: &str) -> Kallsyms {
        Kallsyms::parse(match release {
            "5.10" => include_str!("trace/fixtures/kallsyms-amdgpu-5.10.txt"),
            "6.12" => include_str!("trace/fixtures/kallsyms-amdgpu-6.12.txt"),
            _ => include_str!("trace/fixtures/kallsyms-amdgpu-7.3.txt"),
        })
    }

    fn line(v: &impl Serialize) -> String {
        serde_json::to_string(v).unwrap()
    }

    const KFD_1_17: KfdVersion = KfdVersion { major: 1, minor: 17 };

    /// The whole report for hosts that take each check down each of its branches, pinned in
    /// doctor-reports.txt (`GPREEMPT_BLESS=1` rewrites it): per host the report's JSON without
    /// its lists on one line, then each check and each probe as `doctor --json` serialises it,
    /// one a line (the text output prints the same checks). The tree's path reads `$ROOT`, the
    /// agent's needs `$AGENT_NEEDS` and its capabilities `$CAPABILITIES`.
    #[test]
    fn every_branch_of_every_check_gives_the_pinned_report() {
        let errno = |e| DeviceError::Open(std::io::Error::from_raw_os_error(e));
        let short = "ffffffffc0000000 t kfd_ioctl\t[amdgpu]\nffffffffc0000100 t kfd_ioctl_create_queue\t[amdgpu]\n";
        let mut out = String::new();
        let mut report = |name: &str, host: &FakeHost, k: Option<Kallsyms>, opened: Result<KfdVersion, DeviceError>| {
            let r = diagnose_opened(&roots(host), k.as_ref(), opened);
            let mut lines = vec![format!("# {name}")];
            lines.push(line(&DoctorReport { probes: Vec::new(), checks: Vec::new(), ..r.clone() }));
            lines.extend(r.checks.iter().map(line));
            lines.extend(r.probes.iter().map(line));
            // The agent's needs are pinned by tests/deploy.rs: here only where the report puts them.
            let capabilities = AGENT_NEEDS.capabilities.iter().map(|n| n.name).collect::<Vec<_>>().join(", ");
            let text = lines.join("\n").replace(&host.path().display().to_string(), "$ROOT");
            out += &(text.replace(&line(&AGENT_NEEDS), "$AGENT_NEEDS").replace(&capabilities, "$CAPABILITIES") + "\n");
        };
        report("6.12, KFD 1.17: everything in place", &good_tree(), Some(fixture("6.12")), Ok(KFD_1_17));
        let mut host = good_tree();
        host.file("sys/module/amdgpu/parameters/sched_policy", "2\n")
            .file("proc/sys/kernel/yama/ptrace_scope", "2\n")
            .file("proc/sys/kernel/perf_event_paranoid", "x\n");
        report("6.12, sched_policy=2, Yama 2, no kallsyms", &host, None, Ok(KFD_1_17));
        report("6.12, /dev/kfd not permitted", &good_tree(), Some(fixture("6.12")), Err(DeviceError::PermissionDenied));
        report("6.12, /dev/kfd ENXIO, no kallsyms", &good_tree(), None, Err(errno(libc::ENXIO)));
        let mut host = tree();
        host.file("proc/sys/kernel/osrelease", "7.3.4+deb13-amd64\n")
            .file("sys/class/kfd/kfd/topology/nodes/0/gpu_id", "0\n");
        fs::remove_file(host.path().join("proc/sys/kernel/yama/ptrace_scope")).unwrap();
        fs::remove_file(host.path().join("proc/sys/kernel/perf_event_paranoid")).unwrap();
        fs::remove_file(host.path().join("sys/module/amdgpu/parameters/sched_policy")).unwrap();
        report("7.3 without a GPU: EINVAL at open", &host, Some(fixture("7.3")), Err(errno(libc::EINVAL)));
        report("7.3, KFD 1.20", &host, Some(fixture("7.3")), Ok(KfdVersion { major: 1, minor: 20 }));
        report(
            "6.1, KFD 1.11, two KFD functions",
            &tree(),
            Some(Kallsyms::parse(short)),
            Ok(KfdVersion { major: 1, minor: 11 }),
        );
        report("KFD functions but no /dev/kfd", &tree(), Some(Kallsyms::parse(short)), Err(DeviceError::Missing));
        report("no KFD function, /dev/kfd missing", &tree(), Some(Kallsyms::parse("")), Err(DeviceError::Missing));
        let mut host = tree();
        host.file("proc/sys/kernel/osrelease", "5.10.0-32-amd64\n");
        report("5.10 fixture, KFD 1.3", &host, Some(fixture("5.10")), Ok(KfdVersion { major: 1, minor: 3 }));
        let mut host = tree();
        host.file("sys/class/kfd/kfd/topology/nodes/1/gpu_id", "4096\n").file(
            "sys/class/kfd/kfd/topology/nodes/1/properties",
            "gfx_target_version 120001\ncwsr_size 2138112\nctl_stack_size 20480\n",
        );
        report("gfx12 with KFD 1.17", &host, None, Ok(KFD_1_17));
        let host = tree();
        fs::remove_dir_all(host.path().join("sys/module/amdgpu")).unwrap();
        report(
            "without amdgpu",
            &host,
            Some(Kallsyms::parse("ffffffff81000000 T _stext\n")),
            Err(DeviceError::Missing),
        );
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/doctor-reports.txt");
        if std::env::var_os("GPREEMPT_BLESS").is_some() {
            fs::write(&path, &out).unwrap();
            return;
        }
        let pinned = include_str!("doctor-reports.txt");
        for (got, want) in out.lines().zip(pinned.lines()) {
            assert_eq!(got, want);
        }
        assert_eq!(out, pinned);
    }

    #[test]
    fn a_6_1_host_without_debug_trap_gets_exact_findings() {
        let host = tree();
        let k = Kallsyms::parse(
            "ffffffffc0000000 t kfd_ioctl\t[amdgpu]\nffffffffc0000100 t kfd_ioctl_create_queue\t[amdgpu]\n",
        );
        let r = diagnose(&roots(&host), Some(&k), Some(KfdVersion { major: 1, minor: 11 }));
        assert_eq!(r.kernel, "6.1.0-56-amd64");
        assert!(!r.debug_trap);
        assert_eq!(r.kfd_module.as_deref(), Some("amdgpu"));
        let get = |n: &str| r.checks.iter().find(|c| c.name == n).unwrap();
        assert_eq!(get("debug-trap").status, Status::Warn);
        assert_eq!(get("debug-trap").detail, "absent: needs KFD ≥ 1.13, this kernel has 1.11");
        assert_eq!(get("module-btf").status, Status::Warn);
        assert_eq!(get("ptrace-scope").status, Status::Fail);
        assert_eq!(get("capabilities").detail, "missing CAP_BPF, CAP_PERFMON, CAP_SYSLOG, CAP_SYS_NICE, CAP_IPC_LOCK");
        assert_eq!(get("perf-event-paranoid").status, Status::Warn);
        assert!(get("perf-event-paranoid").detail.starts_with("kernel.perf_event_paranoid=3: "));
        assert_eq!(
            get("perf-event-paranoid").fix.as_deref(),
            Some("sysctl -w kernel.perf_event_paranoid=2, and keep it in /etc/sysctl.d")
        );
        assert_eq!(get("amdgpu.cwsr_enable").status, Status::Warn);
        assert_eq!(get("amdgpu.sched_policy").detail, "0");
        assert_eq!(get("probe create_queue_entry").status, Status::Ok);
        assert_eq!(get("probe destroy_queue_entry").status, Status::Fail);
        assert_eq!(get("debugfs").status, Status::Warn);
        assert_eq!(get("return-probe-losses").status, Status::Warn);
        assert_eq!(
            get("return-probe-losses").detail,
            "not counted: Linux 6.1.0-56-amd64 does not report missed kprobe hits \
             (bpf_link_info.perf_event.kprobe.missed appeared in 6.7); each return probe holds 16 concurrent calls, \
             and a call beyond that (callers sleeping in amdkfd_fence_wait_timeout or kfd_ioctl_runtime_enable) \
             loses its return record silently"
        );
        assert_eq!(r.failures(), 3, "ptrace scope 3 and the two destroy probes");
    }

    #[test]
    fn without_a_kfd_module_the_probe_table_is_one_line() {
        let host = tree();
        // A host whose kallsyms has no KFD function (amdgpu not loaded).
        let k = Kallsyms::parse("ffffffff81000000 T _stext\nffffffffc0000000 t e1000_probe\t[e1000]\n");
        let r = diagnose(&roots(&host), Some(&k), None);
        assert_eq!(r.kfd_module, None);
        assert!(r.probes.is_empty());
        let probe_lines: Vec<(&str, &str)> = r
            .checks
            .iter()
            .filter(|c| c.name.starts_with("probe"))
            .map(|c| (c.name.as_str(), c.detail.as_str()))
            .collect();
        assert_eq!(probe_lines, [("probes", "not checked: no KFD module loaded")]);
        assert_eq!(r.checks.iter().find(|c| c.name == "kfd-module").map(|c| c.status), Some(Status::Fail));
    }

    #[test]
    fn sched_policy_2_disables_debug_trap_even_on_new_kernels() {
        let mut host = tree();
        host.file("sys/module/amdgpu/parameters/sched_policy", "2\n")
            .file("proc/sys/kernel/osrelease", "6.12.117+deb12-amd64\n");
        let r = diagnose(&roots(&host), None, Some(KfdVersion { major: 1, minor: 17 }));
        assert!(!r.debug_trap);
        let c = r.checks.iter().find(|c| c.name == "debug-trap").unwrap();
        assert!(c.detail.contains("sched_policy=2"));
        let losses = r.checks.iter().find(|c| c.name == "return-probe-losses").unwrap();
        assert_eq!(losses.status, Status::Ok);
        assert!(losses.detail.starts_with("counted: each return probe holds 16 concurrent calls"), "{}", losses.detail);
    }

    /// Exactly the capabilities `agent-needs` lists (as the unit and the DaemonSet grant them) are
    /// no capability problem; each one missing is named.
    #[test]
    fn the_capabilities_of_agent_needs_are_enough() {
        let bit = |name: &str| CAP_BITS.iter().find(|(n, _)| *n == name).map(|(_, b)| 1u64 << b).unwrap();
        let granted = AGENT_NEEDS.capabilities.iter().fold(0, |mask, n| mask | bit(n.name));
        assert_eq!(granted, (1 << 14) | (1 << 19) | (1 << 23) | (1 << 34) | (1 << 38) | (1 << 39));
        let c = capability_check(granted);
        assert_eq!(c.status, Status::Ok);
        assert_eq!(c.detail, "CAP_BPF, CAP_PERFMON, CAP_SYSLOG, CAP_SYS_PTRACE, CAP_SYS_NICE, CAP_IPC_LOCK");
        assert_eq!(c.fix, None);
        let c = capability_check(granted & !(1 << 34) & !(1 << 14));
        assert_eq!(c.status, Status::Warn);
        assert_eq!(c.detail, "missing CAP_SYSLOG, CAP_IPC_LOCK");
        assert_eq!(
            capability_check(0).detail,
            "missing CAP_BPF, CAP_PERFMON, CAP_SYSLOG, CAP_SYS_PTRACE, CAP_SYS_NICE, CAP_IPC_LOCK"
        );
    }

    #[test]
    fn capability_mask_parses() {
        assert_eq!(effective_caps("CapInh:\t0\nCapEff:\t000001ffffffffff\n"), Some(0x1ff_ffff_ffff));
        assert_eq!(effective_caps("nothing"), None);
    }

    #[test]
    fn amdgpu_without_a_gpu_on_7_x_is_explained_not_sent_to_modprobe() {
        let mut host = tree();
        host.file("proc/sys/kernel/osrelease", "7.3.4+deb13-amd64\n")
            .file("sys/class/kfd/kfd/topology/nodes/0/gpu_id", "0\n");
        let k = Kallsyms::parse(
            "ffffffffc0000000 t kfd_ioctl\t[amdgpu]\n\
             ffffffffc0000080 t kfd_ioctl_create_queue\t[amdgpu]\n\
             ffffffffc0000100 t kfd_ioctl_set_debug_trap\t[amdgpu]\n\
             ffffffffc0000200 t kfd_ioctl_create_process\t[amdgpu]\n",
        );
        let einval = DeviceError::Open(std::io::Error::from_raw_os_error(libc::EINVAL));
        let r = diagnose_opened(&roots(&host), Some(&k), Err(einval));
        let get = |n: &str| r.checks.iter().find(|c| c.name == n).unwrap();
        assert_eq!(r.kfd_version, None);
        assert_eq!(get("kfd").status, Status::Fail);
        assert_eq!(
            get("kfd").detail,
            "the KFD driver is loaded but has no GPU: open(/dev/kfd) fails with EINVAL (KFD ≥ 1.19 creates the \
             KFD process at open and refuses it without a GPU node; the topology lists none), so the KFD version \
             cannot be asked"
        );
        assert!(!get("kfd").fix.as_deref().unwrap_or_default().contains("modprobe"));
        assert_eq!(
            get("debug-trap").detail,
            "present in the driver (kfd_ioctl_set_debug_trap is loaded) but not usable: /dev/kfd cannot be opened"
        );
        assert_eq!(get("kfd-contexts").status, Status::Info);
        assert!(get("kfd-contexts").detail.starts_with(
            "secondary KFD contexts present (by symbol kfd_ioctl_create_process in /proc/kallsyms): a process may own"
        ));
        assert_eq!(
            r.features.queue_types_by,
            FoundBy::Symbol { name: "kfd_ioctl_create_process" },
            "7.3's kallsyms has CREATE_PROCESS: the 7.x numbering"
        );
        assert_eq!(r.features.queue_types, Some(QueueTypeNumbering::WithoutDiq));
        // KFD functions unloaded while amdgpu's sysfs directory stays: modprobe is the fix.
        let r = diagnose_opened(&roots(&host), Some(&Kallsyms::parse("")), Err(DeviceError::Missing));
        let kfd = r.checks.iter().find(|c| c.name == "kfd").unwrap();
        assert_eq!(kfd.fix.as_deref(), Some("load the driver: `modprobe amdgpu`"));
    }

    #[test]
    fn without_amdgpu_one_check_says_so_and_the_driver_checks_are_skipped() {
        let mut host = tree();
        fs::remove_dir_all(host.path().join("sys/module/amdgpu")).unwrap();
        host.file("proc/sys/kernel/osrelease", "6.12.0\n");
        let r = diagnose_opened(
            &roots(&host),
            Some(&Kallsyms::parse("ffffffff81000000 T _stext\n")),
            Err(DeviceError::Missing),
        );
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(json.matches("amdgpu is not loaded").count(), 1, "{json}");
        assert_eq!(json.matches("modprobe").count(), 1, "{json}");
        assert!(!json.contains("KFD < 1.13"), "{json}");
        let names: Vec<&str> = r.checks.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "kernel",
                "amdgpu",
                "return-probe-losses",
                "ptrace-scope",
                "capabilities",
                "perf-event-paranoid",
                "agent-needs"
            ]
        );
        let amdgpu = &r.checks[1];
        assert_eq!(amdgpu.status, Status::Fail);
        assert_eq!(
            amdgpu.detail,
            "amdgpu is not loaded (no /dev/kfd, no KFD function in the kernel, no /sys/module/amdgpu): the checks of \
             the driver (KFD version, debug-trap, probes, debugfs, module parameters) are skipped"
        );
        // The other failure is the tree's Yama ptrace_scope=3, which has nothing to do with amdgpu.
        let failed: Vec<&str> = r.checks.iter().filter(|c| c.status == Status::Fail).map(|c| c.name.as_str()).collect();
        assert_eq!(failed, ["amdgpu", "ptrace-scope"]);
        // Loaded (its sysfs directory is there): no such line.
        let r = diagnose_opened(&roots(&tree()), None, Ok(KfdVersion { major: 1, minor: 17 }));
        assert!(!serde_json::to_string(&r).unwrap().contains("not loaded"));
    }

    #[test]
    fn linux_5_10_is_told_it_has_no_module_btf_and_kfd_1_3_no_smi_helpers() {
        let mut host = tree();
        host.file("proc/sys/kernel/osrelease", "5.10.0-32-amd64\n");
        let k = Kallsyms::parse(
            "ffffffffc0000000 t kfd_ioctl\t[amdgpu]\nffffffffc0000100 t kfd_ioctl_create_queue\t[amdgpu]\n",
        );
        let r = diagnose(&roots(&host), Some(&k), Some(KfdVersion { major: 1, minor: 3 }));
        let get = |n: &str| r.checks.iter().find(|c| c.name == n).unwrap();
        assert_eq!(
            get("module-btf").detail,
            format!(
                "{}/sys/kernel/btf/amdgpu missing: Linux 5.10.0-32-amd64 loads no module BTF \
                 (CONFIG_DEBUG_INFO_BTF_MODULES appeared in 5.11)",
                host.path().display()
            )
        );
        assert_eq!(
            get("probe smi_eviction").detail,
            "kfd_smi_event_queue_eviction appeared in KFD 1.10 (Linux 5.19); this kernel has 1.3"
        );
        assert_eq!(get("debug-trap").detail, "absent: needs KFD ≥ 1.13, this kernel has 1.3");
        assert!(r.checks.iter().all(|c| c.name != "kfd-contexts"), "KFD 1.3 has one context per process");
    }

    #[test]
    fn gfx12_before_kfd_1_20_is_warned_and_cwsr_sizes_are_shown() {
        let mut host = tree();
        let nodes = "sys/class/kfd/kfd/topology/nodes";
        host.file(format!("{nodes}/1/gpu_id"), "4096\n").file(
            format!("{nodes}/1/properties"),
            "gfx_target_version 120001\ncwsr_size 2138112\nctl_stack_size 20480\n",
        );
        let r = diagnose(&roots(&host), None, Some(KfdVersion { major: 1, minor: 17 }));
        let get = |n: &str| r.checks.iter().find(|c| c.name == n).unwrap();
        assert_eq!(get("expert-scheduling").status, Status::Warn);
        assert_eq!(
            get("expert-scheduling").detail,
            "gfx12 GPU(s) 0x1000: the trap handler lacks expert-scheduling support (absent (by version fallback \
             (KFD 1.17)); upstream KFD 1.20), and suspending queues running such kernels corrupts their waves"
        );
        assert_eq!(
            get("cwsr-size").detail,
            "context-save area per suspended queue: gpu 0x1000 cwsr_size 2138112 B per XCC (control stack 20480 B); \
             per queue × the XCC count, which the topology does not give"
        );
        let r = diagnose(&roots(&host), None, Some(KfdVersion { major: 1, minor: 20 }));
        assert!(r.checks.iter().all(|c| c.name != "expert-scheduling"));
        assert!(r.checks.iter().any(|c| c.name == "kfd-contexts"));
    }

    /// MI300X in CPX mode on a 6.18.4+ kernel: two partitions (one XCC each), `cwsr_size` per
    /// XCC; doctor prints the save area per queue, (cwsr + debug) × num_xcc page-aligned, and
    /// whether a preemption timeout resets one queue (capability bit 31).
    #[test]
    fn mi300x_partitions_get_the_save_area_per_queue_and_per_queue_reset() {
        let mut host = tree();
        let nodes = "sys/class/kfd/kfd/topology/nodes";
        let props = |capability: u32| {
            format!(
                "simd_count 152\narray_count 4\nsimd_arrays_per_engine 1\nsimd_per_cu 4\ngfx_target_version 90402\n\
                 capability {capability}\nnum_xcc 1\ncwsr_size 23203840\nctl_stack_size 12288\nlocation_id 768\n\
                 domain 0\ndrm_render_minor 128\n"
            )
        };
        host.file(format!("{nodes}/1/gpu_id"), "4096\n")
            .file(format!("{nodes}/1/properties"), props(0xAC77_A280))
            .file(format!("{nodes}/2/gpu_id"), "8192\n")
            .file(format!("{nodes}/2/properties"), props(0x2C77_A280));
        let r = diagnose(&roots(&host), None, Some(KFD_1_17));
        let get = |n: &str| r.checks.iter().find(|c| c.name == n).unwrap();
        assert_eq!(
            get("cwsr-size").detail,
            "context-save area per suspended queue: gpu 0x1000 23252992 B per queue (1 XCC × (cwsr_size 23203840 B + \
             debug area), control stack 12288 B per XCC); gpu 0x2000 23252992 B per queue (1 XCC × (cwsr_size \
             23203840 B + debug area), control stack 12288 B per XCC)"
        );
        assert_eq!(
            get("per-queue-reset").detail,
            "a preemption timeout resets only the hung queue (by sysfs topology capability bit 31): gpu 0x1000 yes; \
             gpu 0x2000 no; elsewhere it resets the GPU"
        );
        // One package (location_id 768 = bus 3) whose mode partition 0's render node says.
        assert_eq!(
            get("gpu-partitions").detail,
            "GPU packages by PCI address, their compute partition mode and partitions (gpu_id #index): 0000:03:00.0 \
             mode unknown, 2 KFD node(s): gpu 0x1000 #0, 0x2000 #1; a suspend preempts the queues of its own \
             partition only"
        );
        host.file("sys/class/drm/renderD128/device/current_compute_partition", "CPX\n");
        let r = diagnose(&roots(&host), None, Some(KFD_1_17));
        let get = |n: &str| r.checks.iter().find(|c| c.name == n).unwrap();
        assert!(get("gpu-partitions").detail.contains(": 0000:03:00.0 CPX, 2 KFD node(s): gpu 0x1000 #0, 0x2000 #1;"));
    }
}
