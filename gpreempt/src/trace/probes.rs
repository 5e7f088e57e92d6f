//! The probe table: which eBPF program goes on which KFD function, and what it yields.
//!
//! One declarative table, resolved at start against kallsyms. A missing optional probe is a
//! reported decision, never a crash; a missing required probe stops the tracer with the reason.

use serde::Serialize;

use self::ProbeKind::{Kprobe as K, Kretprobe as R};
use super::symbols::Kallsyms;
use crate::kfd::KfdVersion;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProbeKind {
    Kprobe,
    Kretprobe,
}

/// One row of the table.
#[derive(Clone, Copy, Debug)]
pub struct ProbeSpec {
    /// eBPF program name in the object (`gpreempt-ebpf`).
    pub program: &'static str,
    /// Kernel function (base name; suffixed variants are found by [`Kallsyms::resolve`]).
    pub function: &'static str,
    pub kind: ProbeKind,
    /// Without it the tracer cannot do its job.
    pub required: bool,
    /// When the function appeared, if after the oldest supported kernel (Linux 5.10): the
    /// missing-probe reason names it instead of guessing "inlined or renamed".
    pub since: Option<Since>,
    /// What the probe gives the user.
    pub yields: &'static str,
}

/// Where a function comes from, for the reason a probe on it is missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Since {
    /// Added with this KFD ioctl version (`kfd_ioctl.h` changelog), first in this Linux release.
    Kfd(KfdVersion, &'static str),
    /// Added in this Linux release, with no KFD version of its own (hardware backends).
    Linux(&'static str, &'static str),
}

const fn row(
    program: &'static str,
    function: &'static str,
    kind: ProbeKind,
    required: bool,
    since: Option<Since>,
    yields: &'static str,
) -> ProbeSpec {
    ProbeSpec { program, function, kind, required, since, yields }
}

/// KFD 1.13 (Linux 6.5): the debugger API (`RUNTIME_ENABLE`, `DBG_TRAP`, `suspend_queues`).
const DBG: Option<Since> = Some(Since::Kfd(KfdVersion::DEBUG_TRAP, "6.5"));
/// KFD 1.10 "Add SMI profiler event log" (Linux 5.19): the queue eviction/restore SMI events and
/// their helpers. Debian 5.10.223 (KFD 1.3) has neither; 6.1.192 (KFD 1.11) has both.
const SMI_LOG: Option<Since> = Some(Since::Kfd(KfdVersion { major: 1, minor: 10 }, "5.19"));
/// mes_v11_0.c came with gfx11 (Linux 6.0; Debian 6.1.192 has it, 5.10.223 not).
const MES11: Option<Since> = Some(Since::Linux("6.0", "gfx11 MES"));
/// mes_v12_0.c came with gfx12 (Linux 6.11; Debian 6.12.117 has it, 6.1.192 not).
const MES12: Option<Since> = Some(Since::Linux("6.11", "gfx12 MES"));

/// KFD 1.19 (Linux 7.0): `AMDKFD_IOC_CREATE_PROCESS`, secondary contexts (docs/kfd.md §1.4).
/// Only the upstream numbering: ROCm's DKMS calls 1.19 something else (§1.5), so on such a
/// kernel the reason may name the wrong version; whether the probe attaches is kallsyms' call.
const CONTEXTS: Option<Since> = Some(Since::Kfd(KfdVersion { major: 1, minor: 19 }, "7.0"));

/// Every probe gpreempt knows. The kernel prototype each relies on, with the versions checked
/// (Debian 6.1.192 = KFD 1.11 and 6.12.117 = KFD 1.17 in source; 7.3.4 = KFD 1.23 in its module
/// BTF, where every probed function kept its name and only the SMI helpers changed an argument
/// type), is the `match-proto` comment on its eBPF program in
/// `gpreempt-ebpf/src/{queue,debug,eviction,hws,process}.rs`. Debian 5.10.223 (KFD 1.3) has no
/// module BTF and was checked against kallsyms only. Only the queue ioctls are required:
/// everything else is reported when missing and the trace goes on without it.
pub const PROBES: &[ProbeSpec] = &[
    // Queue lifecycle (ioctl context: current = owner). kfd_chardev.c, 6.1.192 and 6.12.117:
    // static int kfd_ioctl_{create,destroy,update}_queue(struct file *, struct kfd_process *, void *data)
    row(
        "create_queue_entry",
        "kfd_ioctl_create_queue",
        K,
        true,
        None,
        "queue create: ioctl arguments pointer (kept for the return probe)",
    ),
    row(
        "create_queue_return",
        "kfd_ioctl_create_queue",
        R,
        true,
        None,
        "queue create: queue id, gpu id, type, priority, percentage, ring, rptr/wptr, CWSR area, doorbell, result",
    ),
    row("destroy_queue_entry", "kfd_ioctl_destroy_queue", K, true, None, "queue destroy: ioctl arguments pointer"),
    row("destroy_queue_return", "kfd_ioctl_destroy_queue", R, true, None, "queue destroy: queue id, result"),
    row("update_queue_entry", "kfd_ioctl_update_queue", K, false, None, "queue update: ioctl arguments pointer"),
    row(
        "update_queue_return",
        "kfd_ioctl_update_queue",
        R,
        false,
        None,
        "queue update: queue id, ring base/size, percentage, priority, result",
    ),
    // Process lifetime. kfd_process.c: kfd_create_process(struct file *) on 6.1.192,
    // (struct task_struct *) on 6.12.117; static void kfd_process_wq_release(struct work_struct *);
    // void kfd_process_dequeue_from_all_devices(struct kfd_process *); void kfd_procfs_del_queue(struct queue *).
    row(
        "create_process_entry",
        "kfd_create_process",
        K,
        false,
        None,
        "process open: task argument (owner on KFD 1.13+)",
    ),
    row(
        "create_process_return",
        "kfd_create_process",
        R,
        false,
        None,
        "process open: kfd_process pointer -> host pid (pointer learning for kworker probes)",
    ),
    // Secondary KFD contexts (Linux 7.0, KFD 1.19), kfd_chardev.c v7.0 (cc6b66d661fd):
    // static int kfd_ioctl_create_process(struct file *filep, struct kfd_process *p, void *data).
    row("create_context_entry", "kfd_ioctl_create_process", K, false, CONTEXTS, "secondary context: the file pointer"),
    row(
        "create_context_return",
        "kfd_ioctl_create_process",
        R,
        false,
        CONTEXTS,
        "secondary context made: caller, context id (filep->private_data->context_id), result",
    ),
    row(
        "process_release_entry",
        "kfd_process_wq_release",
        K,
        false,
        None,
        "process gone: the kworker frees the kfd_process (owner via BTF release_work offset)",
    ),
    row(
        "process_release_return",
        "kfd_process_wq_release",
        R,
        false,
        None,
        "process gone: ends the teardown attribution of this kworker",
    ),
    row(
        "dequeue_all_entry",
        "kfd_process_dequeue_from_all_devices",
        K,
        false,
        None,
        "process teardown: all queues of the process are unmapped (owner from the kfd_process)",
    ),
    row(
        "procfs_del_queue",
        "kfd_procfs_del_queue",
        K,
        false,
        None,
        "queue removed, incl. at process exit: queue id (q+48) and owner",
    ),
    // Eviction / restore. kfd_smi_events.c, 6.1.192 (struct kfd_dev *) and 6.12.117 (struct kfd_node *):
    // void kfd_smi_event_queue_eviction(dev, pid_t pid, uint32_t trigger); void kfd_smi_event_queue_restore(dev, pid_t pid)
    row(
        "smi_eviction",
        "kfd_smi_event_queue_eviction",
        K,
        false,
        SMI_LOG,
        "eviction begins: host pid, gpu id, trigger (SVM/USERPTR/TTM/SUSPEND/CRIU)",
    ),
    row("smi_restore", "kfd_smi_event_queue_restore", K, false, SMI_LOG, "restore begins: host pid, gpu id"),
    // kfd_process.c, 6.1.192/6.12.117: int kfd_process_evict_queues(struct kfd_process *, uint32_t trigger);
    // int kfd_process_restore_queues(struct kfd_process *)
    row(
        "process_evict_entry",
        "kfd_process_evict_queues",
        K,
        false,
        None,
        "process eviction (all GPUs): owner, trigger",
    ),
    row("process_evict_return", "kfd_process_evict_queues", R, false, None, "process eviction: duration, result"),
    row("process_restore_entry", "kfd_process_restore_queues", K, false, None, "process restore (all GPUs): owner"),
    row("process_restore_return", "kfd_process_restore_queues", R, false, None, "process restore: duration, result"),
    // kfd_device_queue_manager.c (dqm->ops), 6.1.192/6.12.117:
    // static int {evict,restore}_process_queues_{cpsch,nocpsch}(struct device_queue_manager *, struct qcm_process_device *)
    row(
        "evict_cpsch_entry",
        "evict_process_queues_cpsch",
        K,
        false,
        None,
        "per-GPU eviction (HWS): owner (qpd->pqm->process), gpu id",
    ),
    row("evict_cpsch_return", "evict_process_queues_cpsch", R, false, None, "per-GPU eviction (HWS): duration, result"),
    row(
        "evict_nocpsch_entry",
        "evict_process_queues_nocpsch",
        K,
        false,
        None,
        "per-GPU eviction (no HWS): owner, gpu id",
    ),
    row(
        "evict_nocpsch_return",
        "evict_process_queues_nocpsch",
        R,
        false,
        None,
        "per-GPU eviction (no HWS): duration, result",
    ),
    row("restore_cpsch_entry", "restore_process_queues_cpsch", K, false, None, "per-GPU restore (HWS): owner, gpu id"),
    row(
        "restore_cpsch_return",
        "restore_process_queues_cpsch",
        R,
        false,
        None,
        "per-GPU restore (HWS): duration, result",
    ),
    row(
        "restore_nocpsch_entry",
        "restore_process_queues_nocpsch",
        K,
        false,
        None,
        "per-GPU restore (no HWS): owner, gpu id",
    ),
    row(
        "restore_nocpsch_return",
        "restore_process_queues_nocpsch",
        R,
        false,
        None,
        "per-GPU restore (no HWS): duration, result",
    ),
    // Debug-trap preemption, KFD 1.13+ (absent on 6.1.192). kfd_chardev.c, 6.12.117:
    // static int kfd_ioctl_set_debug_trap / kfd_ioctl_runtime_enable(struct file *, struct kfd_process *, void *data);
    // kfd_device_queue_manager.c: int suspend_queues(struct kfd_process *, uint32_t num_queues, uint32_t grace_period,
    // uint64_t exception_clear_mask, uint32_t *usr_queue_id_array); int resume_queues(struct kfd_process *, uint32_t, uint32_t *)
    row("debug_trap_entry", "kfd_ioctl_set_debug_trap", K, false, DBG, "debug trap: ioctl arguments pointer"),
    row(
        "debug_trap_return",
        "kfd_ioctl_set_debug_trap",
        R,
        false,
        DBG,
        "debug trap: target pid, op, queue count, grace period, exception mask, result",
    ),
    row("runtime_enable_entry", "kfd_ioctl_runtime_enable", K, false, DBG, "runtime enable: ioctl arguments pointer"),
    row(
        "runtime_enable_return",
        "kfd_ioctl_runtime_enable",
        R,
        false,
        DBG,
        "runtime enable: mode mask, r_debug, result",
    ),
    row(
        "suspend_queues_entry",
        "suspend_queues",
        K,
        false,
        DBG,
        "suspend: target, queue count, grace period, exception mask",
    ),
    row(
        "suspend_queues_return",
        "suspend_queues",
        R,
        false,
        DBG,
        "suspend: duration, queues suspended, per-id INVALID/ERROR bits",
    ),
    row("resume_queues_entry", "resume_queues", K, false, DBG, "resume: target, queue count"),
    row(
        "resume_queues_return",
        "resume_queues",
        R,
        false,
        DBG,
        "resume: duration, queues resumed, per-id INVALID/ERROR bits",
    ),
    // HWS path, nested on the suspending/evicting thread. kfd_device_queue_manager.c:
    // execute_queues_cpsch(dqm, filter, filter_param[, uint32_t grace_period on 6.12.117]) — inlined on 6.1.192,
    // `.constprop.0` on 6.12.117; unmap_queues_cpsch(dqm, filter, filter_param, [grace_period,] bool reset);
    // static int map_queues_cpsch(dqm); amdkfd_fence_wait_timeout(uint64_t *fence_addr (6.1.192) |
    // struct device_queue_manager * (6.12.117), uint64_t fence_value, unsigned int timeout_ms).
    // kfd_packet_manager.c: int pm_send_runlist(struct packet_manager *, struct list_head *);
    // int pm_send_unmap_queue(struct packet_manager *, enum kfd_unmap_queues_filter, uint32_t, bool)
    row(
        "execute_queues_entry",
        "execute_queues_cpsch",
        K,
        false,
        None,
        "HWS execute (unmap + remap): gpu id, filter, grace period",
    ),
    row("execute_queues_return", "execute_queues_cpsch", R, false, None, "HWS execute: duration, result"),
    row("unmap_queues_entry", "unmap_queues_cpsch", K, false, None, "HWS unmap of the device's queues: gpu id, filter"),
    row("unmap_queues_return", "unmap_queues_cpsch", R, false, None, "HWS unmap: duration, result"),
    row("map_queues_entry", "map_queues_cpsch", K, false, None, "HWS remap (runlist): gpu id"),
    row("map_queues_return", "map_queues_cpsch", R, false, None, "HWS remap: duration, result"),
    row("fence_wait_entry", "amdkfd_fence_wait_timeout", K, false, None, "preemption fence wait: fence value, timeout"),
    row(
        "fence_wait_return",
        "amdkfd_fence_wait_timeout",
        R,
        false,
        None,
        "preemption fence wait: duration = CWSR preemption latency, -ETIME",
    ),
    row("send_runlist_entry", "pm_send_runlist", K, false, None, "runlist submission"),
    row("send_runlist_return", "pm_send_runlist", R, false, None, "runlist submission: duration, result"),
    row("send_unmap_entry", "pm_send_unmap_queue", K, false, None, "UNMAP_QUEUES packet: filter, reset"),
    row("send_unmap_return", "pm_send_unmap_queue", R, false, None, "UNMAP_QUEUES packet: duration, result"),
    // MES (gfx11/gfx12; per-queue preemption instead of HWS unmap). mes_v11_0.c / mes_v12_0.c, 6.12.117
    // (v11 also on 6.1.192): static int mes_v1X_0_{remove,add}_hw_queue(struct amdgpu_mes *, struct mes_*_queue_input *)
    row("mes11_remove_entry", "mes_v11_0_remove_hw_queue", K, false, MES11, "MES remove queue (gfx11)"),
    row(
        "mes11_remove_return",
        "mes_v11_0_remove_hw_queue",
        R,
        false,
        MES11,
        "MES remove queue (gfx11): duration, result",
    ),
    row("mes11_add_entry", "mes_v11_0_add_hw_queue", K, false, MES11, "MES add queue (gfx11)"),
    row("mes11_add_return", "mes_v11_0_add_hw_queue", R, false, MES11, "MES add queue (gfx11): duration, result"),
    row("mes12_remove_entry", "mes_v12_0_remove_hw_queue", K, false, MES12, "MES remove queue (gfx12)"),
    row(
        "mes12_remove_return",
        "mes_v12_0_remove_hw_queue",
        R,
        false,
        MES12,
        "MES remove queue (gfx12): duration, result",
    ),
    row("mes12_add_entry", "mes_v12_0_add_hw_queue", K, false, MES12, "MES add queue (gfx12)"),
    row("mes12_add_return", "mes_v12_0_add_hw_queue", R, false, MES12, "MES add queue (gfx12): duration, result"),
    // GPU reset after a failed preemption: kfd_hws_hang -> hw_exception_work -> amdgpu_amdkfd.c,
    // 6.1.192/6.12.117: void amdgpu_amdkfd_gpu_reset(struct amdgpu_device *adev)
    row(
        "gpu_reset",
        "amdgpu_amdkfd_gpu_reset",
        K,
        false,
        None,
        "ALARM: GPU reset (a preemption failed or the HWS hung)",
    ),
    // gfx9 per-queue reset (6.12+), kfd_device_queue_manager.c: static void set_queue_as_reset(
    // struct device_queue_manager *dqm, struct queue *q, struct qcm_process_device *qpd); inlined on
    // Debian 6.12.117, a .text.unlikely symbol on 7.3.4 (docs/kfd.md §2.4).
    row(
        "set_queue_as_reset",
        "set_queue_as_reset",
        K,
        false,
        Some(Since::Linux("6.12", "gfx9 per-queue reset")),
        "a queue reset alone after it failed a preemption: owner, gpu, queue id (SUSPEND_QUEUES counts it suspended)",
    ),
];

/// `gpreempt trace --empty-probes` (hidden, for `cargo xtask bench`): empty programs on the
/// functions of the two benchmarked ioctl paths, to measure the kprobe + kretprobe floor.
pub const FLOOR: &[ProbeSpec] = &[
    row("floor_create_queue_entry", "kfd_ioctl_create_queue", K, true, None, "nothing (floor)"),
    row("floor_create_queue_return", "kfd_ioctl_create_queue", R, true, None, "nothing (floor)"),
    row("floor_debug_trap_entry", "kfd_ioctl_set_debug_trap", K, false, DBG, "nothing (floor)"),
    row("floor_debug_trap_return", "kfd_ioctl_set_debug_trap", R, false, DBG, "nothing (floor)"),
    row("floor_suspend_queues_entry", "suspend_queues", K, false, DBG, "nothing (floor)"),
    row("floor_suspend_queues_return", "suspend_queues", R, false, DBG, "nothing (floor)"),
    row("floor_resume_queues_entry", "resume_queues", K, false, DBG, "nothing (floor)"),
    row("floor_resume_queues_return", "resume_queues", R, false, DBG, "nothing (floor)"),
];

/// A probe resolved against the running kernel.
#[derive(Clone, Debug, Serialize)]
pub struct ResolvedProbe {
    pub program: &'static str,
    pub function: &'static str,
    pub kind: ProbeKind,
    pub required: bool,
    /// The symbol to attach to (may carry a `.constprop.N` suffix); `None` when missing.
    pub symbol: Option<String>,
    pub module: Option<String>,
    /// Why it is missing, when it is.
    pub missing_reason: Option<String>,
}

/// `6.12.117+deb12-amd64` → (6, 12); None when the release does not start with two numbers.
pub fn release_version(release: &str) -> Option<(u32, u32)> {
    let mut numbers = release.split(|c: char| !c.is_ascii_digit()).map(str::parse::<u32>);
    match (numbers.next(), numbers.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => Some((major, minor)),
        _ => None,
    }
}

/// Resolve every row of `table` in the module that provides KFD. `kfd` is the KFD ioctl version
/// and `release` the running kernel's (`/proc/sys/kernel/osrelease`), when known: with them a
/// missing probe's reason says which version added the function.
pub fn resolve(
    table: &[ProbeSpec],
    kallsyms: &Kallsyms,
    kfd: Option<KfdVersion>,
    release: Option<&str>,
) -> Vec<ResolvedProbe> {
    let module = kallsyms.kfd_module().flatten();
    let linux = release.and_then(release_version);
    let older = |since: &str| match (release_version(since), linux) {
        (Some(since), Some(have)) => have < since,
        _ => false,
    };
    table
        .iter()
        .map(|spec| {
            let symbol = kallsyms.resolve(spec.function, module);
            let missing_reason = match (symbol, spec.since, kfd) {
                (Some(_), _, _) => None,
                (None, Some(Since::Kfd(min, linux)), Some(have)) if have < min => {
                    Some(format!("{} appeared in KFD {min} (Linux {linux}); this kernel has {have}", spec.function))
                }
                (None, Some(Since::Kfd(min, linux)), None) => Some(format!(
                    "{} is not in /proc/kallsyms: it appeared in KFD {min} (Linux {linux}) and this KFD is older",
                    spec.function
                )),
                (None, Some(Since::Linux(since, what)), _) if older(since) => Some(format!(
                    "{} appeared in Linux {since} ({what}); this kernel is {}",
                    spec.function,
                    release.unwrap_or("older")
                )),
                (None, _, _) => Some(format!(
                    "{} is not in /proc/kallsyms{} (inlined or renamed in this build)",
                    spec.function,
                    module.map(|m| format!(" for module {m}")).unwrap_or_default()
                )),
            };
            ResolvedProbe {
                program: spec.program,
                function: spec.function,
                kind: spec.kind,
                required: spec.required,
                symbol: symbol.map(|s| s.name.clone()),
                module: symbol.and_then(|s| s.module.clone()),
                missing_reason,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_program_is_named_once_per_kind_and_function() {
        let mut seen = std::collections::HashSet::new();
        for p in PROBES {
            assert!(seen.insert(p.program), "program {} listed twice", p.program);
        }
    }

    #[test]
    fn resolution_reports_the_symbol_and_why_a_probe_is_missing() {
        let k = Kallsyms::parse(
            "ffffffffc0000000 t kfd_ioctl\t[amdgpu]\nffffffffc0000100 t kfd_ioctl_create_queue\t[amdgpu]\n",
        );
        let table = [
            PROBES[0],
            PROBES[2],
            ProbeSpec {
                program: "x",
                function: "suspend_queues",
                kind: ProbeKind::Kprobe,
                required: false,
                since: DBG,
                yields: "",
            },
        ];
        let r = resolve(&table, &k, Some(KfdVersion { major: 1, minor: 11 }), Some("6.1.0-56-amd64"));
        assert_eq!(r[0].symbol.as_deref(), Some("kfd_ioctl_create_queue"));
        assert_eq!(r[0].module.as_deref(), Some("amdgpu"));
        assert!(r[0].missing_reason.is_none());
        assert_eq!(r[1].symbol, None);
        assert_eq!(
            r[1].missing_reason.as_deref(),
            Some(
                "kfd_ioctl_destroy_queue is not in /proc/kallsyms for module amdgpu (inlined or renamed in this build)"
            )
        );
        assert_eq!(
            r[2].missing_reason.as_deref(),
            Some("suspend_queues appeared in KFD 1.13 (Linux 6.5); this kernel has 1.11")
        );
    }

    /// The table against the real kallsyms of the four test kernels (captured in the VM; see
    /// `fixtures/`): exactly which functions attach and why the others do not. `kfd` is None
    /// where `/dev/kfd` cannot be opened (7.x without a GPU).
    fn missing(table: &[ProbeSpec], kernel: &str, kfd: Option<KfdVersion>) -> (usize, Vec<(String, String)>) {
        let (text, release) = match kernel {
            "5.10" => (include_str!("fixtures/kallsyms-amdgpu-5.10.txt"), "5.10.0-32-amd64"),
            "6.1" => (include_str!("fixtures/kallsyms-amdgpu-6.1.txt"), "6.1.0-56-amd64"),
            "6.12" => (include_str!("fixtures/kallsyms-amdgpu-6.12.txt"), "6.12.117+deb12-amd64"),
            _ => (include_str!("fixtures/kallsyms-amdgpu-7.3.txt"), "7.3.4+deb13-amd64"),
        };
        let resolved = resolve(table, &Kallsyms::parse(text), kfd, Some(release));
        let attached = resolved.iter().filter(|p| p.symbol.is_some()).count();
        let mut missing: Vec<(String, String)> = resolved
            .iter()
            .filter(|p| p.symbol.is_none())
            .map(|p| (p.program.to_owned(), p.missing_reason.clone().unwrap_or_default()))
            .collect();
        missing.sort();
        (attached, missing)
    }

    #[test]
    fn debian_6_1_attaches_all_but_the_debugger_api_mes12_and_the_inlined_execute() {
        let (attached, missing) = missing(PROBES, "6.1", Some(KfdVersion { major: 1, minor: 11 }));
        let names: Vec<&str> = missing.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            names,
            [
                "create_context_entry",
                "create_context_return",
                "debug_trap_entry",
                "debug_trap_return",
                "execute_queues_entry",
                "execute_queues_return",
                "mes12_add_entry",
                "mes12_add_return",
                "mes12_remove_entry",
                "mes12_remove_return",
                "resume_queues_entry",
                "resume_queues_return",
                "runtime_enable_entry",
                "runtime_enable_return",
                "set_queue_as_reset",
                "suspend_queues_entry",
                "suspend_queues_return",
            ]
        );
        assert_eq!(attached, PROBES.len() - names.len());
        let reason = |program: &str| missing.iter().find(|(p, _)| p == program).map(|(_, r)| r.as_str());
        assert_eq!(
            reason("set_queue_as_reset"),
            Some("set_queue_as_reset appeared in Linux 6.12 (gfx9 per-queue reset); this kernel is 6.1.0-56-amd64")
        );
        assert_eq!(
            reason("suspend_queues_entry"),
            Some("suspend_queues appeared in KFD 1.13 (Linux 6.5); this kernel has 1.11")
        );
        assert_eq!(
            reason("create_context_return"),
            Some("kfd_ioctl_create_process appeared in KFD 1.19 (Linux 7.0); this kernel has 1.11")
        );
        assert_eq!(
            reason("mes12_add_entry"),
            Some("mes_v12_0_add_hw_queue appeared in Linux 6.11 (gfx12 MES); this kernel is 6.1.0-56-amd64")
        );
        assert_eq!(
            reason("execute_queues_entry"),
            Some("execute_queues_cpsch is not in /proc/kallsyms for module amdgpu (inlined or renamed in this build)")
        );
    }

    #[test]
    fn debian_6_12_attaches_every_probe_but_create_process_and_the_inlined_reset_including_the_constprop_execute() {
        let (attached, missing) = missing(PROBES, "6.12", Some(KfdVersion { major: 1, minor: 17 }));
        // set_queue_as_reset is inlined into unmap_queues_cpsch in Debian's 6.12.117 build;
        // CREATE_PROCESS came in 7.0.
        let create = "kfd_ioctl_create_process appeared in KFD 1.19 (Linux 7.0); this kernel has 1.17";
        let inlined =
            "set_queue_as_reset is not in /proc/kallsyms for module amdgpu (inlined or renamed in this build)";
        let expected: Vec<(String, String)> =
            [("create_context_entry", create), ("create_context_return", create), ("set_queue_as_reset", inlined)]
                .iter()
                .map(|(p, r)| ((*p).to_owned(), (*r).to_owned()))
                .collect();
        assert_eq!(missing, expected);
        assert_eq!(attached, PROBES.len() - 3);
        let k = Kallsyms::parse(include_str!("fixtures/kallsyms-amdgpu-6.12.txt"));
        assert_eq!(k.resolve("execute_queues_cpsch", Some("amdgpu")).unwrap().name, "execute_queues_cpsch.constprop.0");
    }

    #[test]
    fn the_floor_table_attaches_all_on_6_12_and_only_the_create_pair_on_6_1() {
        assert_eq!(missing(FLOOR, "6.12", Some(KfdVersion { major: 1, minor: 17 })), (FLOOR.len(), Vec::new()));
        let (attached, missing) = missing(FLOOR, "6.1", Some(KfdVersion { major: 1, minor: 11 }));
        assert_eq!(attached, 2);
        let names: Vec<&str> = missing.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            names,
            [
                "floor_debug_trap_entry",
                "floor_debug_trap_return",
                "floor_resume_queues_entry",
                "floor_resume_queues_return",
                "floor_suspend_queues_entry",
                "floor_suspend_queues_return",
            ]
        );
    }

    #[test]
    fn debian_5_10_attaches_the_queue_process_eviction_and_hws_probes_and_names_what_came_later() {
        let (attached, missing) = missing(PROBES, "5.10", Some(KfdVersion { major: 1, minor: 3 }));
        let reason = |program: &str| missing.iter().find(|(p, _)| p == program).map(|(_, r)| r.as_str());
        let names: Vec<&str> = missing.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            names,
            [
                "create_context_entry",
                "create_context_return",
                "debug_trap_entry",
                "debug_trap_return",
                "execute_queues_entry",
                "execute_queues_return",
                "mes11_add_entry",
                "mes11_add_return",
                "mes11_remove_entry",
                "mes11_remove_return",
                "mes12_add_entry",
                "mes12_add_return",
                "mes12_remove_entry",
                "mes12_remove_return",
                "resume_queues_entry",
                "resume_queues_return",
                "runtime_enable_entry",
                "runtime_enable_return",
                "set_queue_as_reset",
                "smi_eviction",
                "smi_restore",
                "suspend_queues_entry",
                "suspend_queues_return",
            ]
        );
        assert_eq!(attached, 35);
        assert_eq!(attached, PROBES.len() - names.len());
        assert_eq!(
            reason("smi_eviction"),
            Some("kfd_smi_event_queue_eviction appeared in KFD 1.10 (Linux 5.19); this kernel has 1.3")
        );
        assert_eq!(
            reason("mes11_add_entry"),
            Some("mes_v11_0_add_hw_queue appeared in Linux 6.0 (gfx11 MES); this kernel is 5.10.0-32-amd64")
        );
        assert_eq!(
            reason("suspend_queues_entry"),
            Some("suspend_queues appeared in KFD 1.13 (Linux 6.5); this kernel has 1.3")
        );
        // Inlined on 5.10.223 as on 6.1.192: the reason cannot name a version.
        assert_eq!(
            reason("execute_queues_entry"),
            Some("execute_queues_cpsch is not in /proc/kallsyms for module amdgpu (inlined or renamed in this build)")
        );
        let k = Kallsyms::parse(include_str!("fixtures/kallsyms-amdgpu-5.10.txt"));
        assert_eq!(k.resolve("unmap_queues_cpsch", Some("amdgpu")).unwrap().name, "unmap_queues_cpsch.constprop.0");
    }

    #[test]
    fn debian_7_3_attaches_every_probe_without_a_kfd_version() {
        // /dev/kfd cannot be opened without a GPU on 7.x: the version is unknown, nothing is missing.
        let (attached, absent) = missing(PROBES, "7.3", None);
        assert_eq!(absent, Vec::<(String, String)>::new());
        assert_eq!(attached, PROBES.len());
        let k = Kallsyms::parse(include_str!("fixtures/kallsyms-amdgpu-7.3.txt"));
        let symbol = |f: &str| k.resolve(f, Some("amdgpu")).map(|s| s.name.as_str());
        assert_eq!(symbol("execute_queues_cpsch"), Some("execute_queues_cpsch.constprop.0"));
        assert_eq!(symbol("kfd_ioctl_create_process"), Some("kfd_ioctl_create_process"));
        assert_eq!(self::missing(FLOOR, "7.3", None), (FLOOR.len(), Vec::new()));
    }

    #[test]
    fn the_coverage_over_the_four_kernels() {
        let count = |kernel, kfd| missing(PROBES, kernel, kfd).0;
        assert_eq!(PROBES.len(), 58);
        assert_eq!(
            [
                count("5.10", Some(KfdVersion { major: 1, minor: 3 })),
                count("6.1", Some(KfdVersion { major: 1, minor: 11 })),
                count("6.12", Some(KfdVersion { major: 1, minor: 17 })),
                count("7.3", None),
            ],
            [35, 41, 55, 58]
        );
    }
}
