//! `gpreempt doctor`: what this host offers gpreempt, and what to do about each gap.
//!
//! Every check is a typed [`Check`] (status, what was found, the fix); the binary prints them as
//! text or JSON. Reading only: nothing is attached and nothing is changed, except that the KFD
//! version is asked by opening `/dev/kfd` (which registers a short-lived KFD process).

use std::{fs, path::Path};

use serde::Serialize;

use crate::{
    host::{self, procinfo::effective_caps},
    kfd::{Device, KfdVersion, device::DeviceError},
    trace::{
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

/// One thing a deployment grants the agent, and why the agent needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Need {
    pub name: &'static str,
    pub why: &'static str,
    /// Absent on hosts that do not use it (another container runtime, no Kubernetes): mounted
    /// when present, not required.
    pub optional: bool,
}

/// What `gpreempt agent` needs from its host, and nothing more: the one list the deployment
/// files (deploy/gpreempt-agent.service, deploy/kubernetes/) are checked against
/// (gpreempt/tests/deploy.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct AgentNeeds {
    pub capabilities: &'static [Need],
    /// Host paths read (hostPath mounts in a container; read-only).
    pub paths: &'static [Need],
    /// Device nodes opened read-write.
    pub devices: &'static [Need],
}

const fn need(name: &'static str, why: &'static str) -> Need {
    Need { name, why, optional: false }
}

const fn optional(name: &'static str, why: &'static str) -> Need {
    Need { name, why, optional: true }
}

pub const AGENT_NEEDS: AgentNeeds = AgentNeeds {
    capabilities: &[
        need("CAP_BPF", "load the eBPF programs and create their maps"),
        need("CAP_PERFMON", "attach kprobes through the kprobe PMU and read kernel memory from the programs"),
        need("CAP_SYSLOG", "read the KFD functions' addresses in /proc/kallsyms (kptr_restrict hides them)"),
        need("CAP_SYS_PTRACE", "policies: attach the debug trap to offline processes (docs/kfd.md §2.1)"),
        // schedule/realtime.rs: pthread_setschedparam(SCHED_FIFO) and mlockall answer EPERM
        // without them, and the reaction thread then runs unprotected (said once in the log).
        need(
            "CAP_SYS_NICE",
            "policies: SCHED_FIFO priority for the scheduler's reaction thread (rt_priority), so CPU load does not delay a suspend",
        ),
        need("CAP_IPC_LOCK", "policies: mlockall, so no page fault stalls a step of the reaction thread"),
    ],
    paths: &[
        need("/sys/kernel/btf", "vmlinux and amdgpu BTF: the probes' struct offsets"),
        need("/sys/class/kfd", "the KFD processes and queues that exist when the agent starts"),
        need("/sys/devices/virtual/kfd", "where /sys/class/kfd's links point"),
        optional("/var/lib/kubelet/pods", "a pod's presence on this node"),
        optional(
            "/run/containerd/io.containerd.runtime.v2.task/k8s.io",
            "containerd: a container's pod name and namespace",
        ),
        optional("/run/containers/storage/overlay-containers", "CRI-O: a container's pod name and namespace"),
        optional("/var/lib/containers/storage/overlay-containers", "Podman: a container's name (containers.json)"),
        optional("/var/lib/docker/containers", "Docker (cri-dockerd): a container's pod name and namespace"),
    ],
    devices: &[need("/dev/kfd", "policies: the debug-trap ioctls on offline processes")],
};

/// Everything doctor found.
#[derive(Clone, Debug, Serialize)]
pub struct DoctorReport {
    pub kernel: String,
    pub kfd_version: Option<KfdVersion>,
    pub debug_trap: bool,
    pub kfd_module: Option<String>,
    pub probes: Vec<ResolvedProbe>,
    pub checks: Vec<Check>,
    /// What `gpreempt agent` needs from this host (the same on every host).
    pub agent_needs: AgentNeeds,
}

impl DoctorReport {
    pub fn failures(&self) -> usize {
        self.checks.iter().filter(|c| c.status == Status::Fail).count()
    }
}

pub use crate::host::roots::Roots;

fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

/// Module BTF (`/sys/kernel/btf/<module>`, CONFIG_DEBUG_INFO_BTF_MODULES) appeared in Linux 5.11.
const MODULE_BTF_SINCE: (u32, u32) = (5, 11);

/// Capability bits we care about (linux/capability.h).
const CAPS: [(u32, &str); 4] = [(19, "CAP_SYS_PTRACE"), (21, "CAP_SYS_ADMIN"), (38, "CAP_PERFMON"), (39, "CAP_BPF")];

/// Run every check. `kfd` is the KFD version if known (None: ask `/dev/kfd`).
pub fn diagnose(roots: &Roots, kallsyms: Option<&Kallsyms>, kfd: Option<KfdVersion>) -> DoctorReport {
    let opened = match kfd {
        Some(v) => Ok(v),
        None => Device::open().and_then(|d| d.version()),
    };
    diagnose_opened(roots, kallsyms, opened)
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

/// What KFD 1.19 and 1.20 change for the controller, and the CWSR bytes a suspend saves where
/// the topology says (docs/kfd.md §1.4, §4.4).
fn kfd_1_19_checks(roots: &Roots, kallsyms: Option<&Kallsyms>, kfd: Option<KfdVersion>) -> Vec<Check> {
    let mut checks = Vec::new();
    // Without the version (7.x without a GPU), the ioctl's handler in kallsyms tells.
    let create_process_loaded =
        kallsyms.is_some_and(|k| k.resolve("kfd_ioctl_create_process", k.kfd_module().flatten()).is_some());
    if kfd.map_or(create_process_loaded, KfdVersion::has_secondary_contexts) {
        checks.push(Check::new(
            "kfd-contexts",
            Status::Info,
            "KFD ≥ 1.19: a process may own several KFD contexts (AMDKFD_IOC_CREATE_PROCESS on another /dev/kfd \
             file); sysfs, DBG_TRAP and GET_QUEUE_SNAPSHOT by pid reach only its primary context (the driver \
             refuses the debug trap on a secondary one), so queues of secondary contexts are neither listed \
             nor suspended",
            None,
        ));
    }
    let gpus = host::topology::gpu_nodes(&roots.sys).unwrap_or_default();
    let gfx12: Vec<String> = gpus.iter().filter(|g| g.is_gfx12()).map(|g| format!("{:#x}", g.gpu_id.0)).collect();
    match kfd {
        Some(v) if v.has_debug_trap() && !v.has_expert_sched_trap() && !gfx12.is_empty() => checks.push(Check::new(
            "expert-scheduling",
            Status::Warn,
            format!(
                "gfx12 GPU(s) {} with KFD {v}: the trap handler lacks expert-scheduling support (KFD {}), \
                 and suspending queues running such kernels corrupts their waves",
                gfx12.join(", "),
                KfdVersion::EXPERT_SCHED_TRAP
            ),
            Some("do not suspend processes on these GPUs; use a driver with KFD ≥ 1.20"),
        )),
        _ => {}
    }
    let sized: Vec<String> = gpus
        .iter()
        .filter_map(|g| {
            let cwsr = g.cwsr_size?;
            Some(format!(
                "gpu {:#x} {cwsr} B per queue (control stack {} B)",
                g.gpu_id.0,
                g.ctl_stack_size.unwrap_or(0)
            ))
        })
        .collect();
    if !sized.is_empty() {
        checks.push(Check::new(
            "cwsr-size",
            Status::Info,
            format!("wave state saved per suspended queue (topology cwsr_size): {}", sized.join("; ")),
            None,
        ));
    }
    checks
}

/// Like [`diagnose`], with the result of opening `/dev/kfd` and asking its version given.
pub fn diagnose_opened(
    roots: &Roots,
    kallsyms: Option<&Kallsyms>,
    opened: Result<KfdVersion, DeviceError>,
) -> DoctorReport {
    let mut checks = Vec::new();
    let kernel = read_trimmed(&roots.proc.join("sys/kernel/osrelease")).unwrap_or_else(|| "unknown".to_owned());
    checks.push(Check::new("kernel", Status::Info, format!("Linux {kernel}"), None));

    // KFD ioctl version: GET_VERSION on /dev/kfd.
    let kfd_loaded = kallsyms.and_then(Kallsyms::kfd_module).is_some();
    // Without the module every check of the driver would fail on its own and send the user to
    // modprobe several times over: one line says it, and those checks are skipped.
    let amdgpu_loaded =
        kfd_loaded || !matches!(opened, Err(DeviceError::Missing)) || roots.sys.join("module/amdgpu").exists();
    checks.push(if amdgpu_loaded {
        kfd_check(roots, kfd_loaded, &opened)
    } else {
        Check::new(
            "amdgpu",
            Status::Fail,
            "amdgpu is not loaded (no /dev/kfd, no KFD function in the kernel, no /sys/module/amdgpu): the checks of \
             the driver (KFD version, debug-trap, probes, debugfs, module parameters) are skipped",
            Some("`modprobe amdgpu` on a host with an AMD GPU, then run `gpreempt doctor` again"),
        )
    });
    let kfd_version = opened.ok();

    let params = roots.sys.join("module/amdgpu/parameters");
    let param = |name: &str| read_trimmed(&params.join(name));
    let sched_policy = param("sched_policy");
    let debug_trap = kfd_version.is_some_and(KfdVersion::has_debug_trap) && sched_policy.as_deref() != Some("2");
    let debug_trap_check = match (kfd_version, sched_policy.as_deref()) {
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
    };
    if amdgpu_loaded {
        checks.push(debug_trap_check);
    }

    checks.extend(kfd_1_19_checks(roots, kallsyms, kfd_version));

    // Which module provides KFD, and its BTF.
    let kfd_module = kallsyms.and_then(Kallsyms::kfd_module).map(|m| m.unwrap_or("vmlinux").to_owned());
    match (&kfd_module, kallsyms) {
        _ if !amdgpu_loaded => {}
        (Some(m), _) => {
            checks.push(Check::new("kfd-module", Status::Ok, format!("KFD functions are in [{m}]"), None));
            let btf = roots.sys.join("kernel/btf").join(m);
            let linux = probes::release_version(&kernel);
            checks.push(if btf.exists() {
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
                    Some("the tracer falls back to pointer learning; install a kernel with CONFIG_DEBUG_INFO_BTF_MODULES for struct offsets"),
                )
            });
        }
        (None, Some(_)) => checks.push(Check::new(
            "kfd-module",
            Status::Fail,
            "no KFD functions in /proc/kallsyms",
            Some("load the driver: `modprobe amdgpu`"),
        )),
        (None, None) => checks.push(Check::new(
            "kfd-module",
            Status::Warn,
            "/proc/kallsyms not readable",
            Some("run as root to see kernel symbols"),
        )),
    }
    // Without a KFD provider every probe would be "missing": one line says why none was checked.
    let probes = match (kallsyms, &kfd_module) {
        (Some(k), Some(_)) => probes::resolve(probes::PROBES, k, kfd_version, Some(&kernel)),
        (Some(_), None) => {
            if amdgpu_loaded {
                checks.push(Check::new("probes", Status::Info, "not checked: no KFD module loaded", None));
            }
            Vec::new()
        }
        (None, _) => Vec::new(),
    };
    for p in &probes {
        let name = format!("probe {}", p.program);
        checks.push(match (&p.symbol, p.required) {
            (Some(sym), _) => Check::new(&name, Status::Ok, format!("{:?} on {sym}", p.kind), None),
            (None, true) => Check::new(
                &name,
                Status::Fail,
                p.missing_reason.clone().unwrap_or_default(),
                Some("the tracer cannot start; report this kernel build"),
            ),
            (None, false) => Check::new(&name, Status::Warn, p.missing_reason.clone().unwrap_or_default(), None),
        });
    }

    checks.push(return_probe_losses(roots, &kernel));

    let debugfs = if roots.debugfs_kfd.join("mqds").exists() {
        Check::new("debugfs", Status::Ok, format!("{} readable", roots.debugfs_kfd.display()), None)
    } else {
        Check::new(
            "debugfs",
            Status::Warn,
            format!("{} not found", roots.debugfs_kfd.display()),
            Some("mount debugfs (`mount -t debugfs none /sys/kernel/debug`) for `ps --hw`"),
        )
    };
    if amdgpu_loaded {
        checks.push(debugfs);
    }

    match read_trimmed(&roots.proc.join("sys/kernel/yama/ptrace_scope")).as_deref() {
        None => checks.push(Check::new("ptrace-scope", Status::Info, "Yama not active", None)),
        Some("0") | Some("1") => {
            checks.push(Check::new("ptrace-scope", Status::Ok, "Yama ptrace_scope allows a privileged tracer", None));
        }
        Some("2") => checks.push(Check::new(
            "ptrace-scope",
            Status::Warn,
            "Yama ptrace_scope=2: only CAP_SYS_PTRACE may attach",
            Some("run gpreempt as root (it has CAP_SYS_PTRACE)"),
        )),
        Some(other) => checks.push(Check::new(
            "ptrace-scope",
            Status::Fail,
            format!("Yama ptrace_scope={other}: ptrace attach is disabled until reboot"),
            Some("the controller cannot work on this boot; set kernel.yama.ptrace_scope=1 at boot"),
        )),
    }

    let caps = read_trimmed(&roots.proc.join("self/status")).as_deref().and_then(effective_caps).unwrap_or(0);
    let missing: Vec<&str> = CAPS.iter().filter(|(bit, _)| caps & (1 << bit) == 0).map(|(_, n)| *n).collect();
    checks.push(if missing.is_empty() {
        Check::new("capabilities", Status::Ok, "CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYS_PTRACE", None)
    } else {
        Check::new(
            "capabilities",
            Status::Warn,
            format!("missing {}", missing.join(", ")),
            Some("run gpreempt as root (sudo)"),
        )
    });

    // Debian's and Ubuntu's kernels: above 2, perf_event_open(2) needs CAP_SYS_ADMIN (trace::loader).
    let paranoid = read_trimmed(&roots.proc.join("sys/kernel/perf_event_paranoid"));
    checks.push(match paranoid.as_deref().map(str::parse::<i32>) {
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
    });

    for (name, good, fix) in [
        (
            "cwsr_enable",
            Some("1"),
            "CWSR off: preemption waits for waves to drain and long kernels hit the timeout; load amdgpu with cwsr_enable=1",
        ),
        ("sched_policy", None, ""),
        ("mes", None, ""),
        ("queue_preemption_timeout_ms", None, ""),
        ("hws_max_conc_proc", None, ""),
    ]
    .into_iter()
    .filter(|_| amdgpu_loaded)
    {
        let check_name = format!("amdgpu.{name}");
        checks.push(match (param(name), good) {
            (None, _) => Check::new(&check_name, Status::Info, "not readable", None),
            (Some(v), Some(good)) if v != good => Check::new(&check_name, Status::Warn, v, Some(fix)),
            (Some(v), _) => Check::new(&check_name, Status::Info, v, None),
        });
    }

    let names = |needs: &[Need]| needs.iter().map(|n| n.name).collect::<Vec<_>>().join(", ");
    checks.push(Check::new(
        "agent-needs",
        Status::Info,
        format!(
            "gpreempt agent needs {}; reads {}; opens {}",
            names(AGENT_NEEDS.capabilities),
            names(AGENT_NEEDS.paths),
            names(AGENT_NEEDS.devices)
        ),
        None,
    ));
    DoctorReport { kernel, kfd_version, debug_trap, kfd_module, probes, checks, agent_needs: AGENT_NEEDS }
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
        assert_eq!(get("capabilities").detail, "missing CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF");
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
        assert!(get("kfd-contexts").detail.starts_with("KFD ≥ 1.19: a process may own several KFD contexts"));
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
            "gfx12 GPU(s) 0x1000 with KFD 1.17: the trap handler lacks expert-scheduling support (KFD 1.20), and \
             suspending queues running such kernels corrupts their waves"
        );
        assert_eq!(
            get("cwsr-size").detail,
            "wave state saved per suspended queue (topology cwsr_size): gpu 0x1000 2138112 B per queue (control stack 20480 B)"
        );
        let r = diagnose(&roots(&host), None, Some(KfdVersion { major: 1, minor: 20 }));
        assert!(r.checks.iter().all(|c| c.name != "expert-scheduling"));
        assert!(r.checks.iter().any(|c| c.name == "kfd-contexts"));
    }
}
