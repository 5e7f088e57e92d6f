//! The probe table: which eBPF program goes on which KFD function, and what it yields.
//!
//! One declarative table, resolved at start against kallsyms. A missing optional probe is a
//! reported decision, never a crash; a missing required probe stops the tracer with the reason.

use serde::Serialize;

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
    /// KFD ioctl version that introduced the function, if newer than every supported kernel.
    pub min_kfd: Option<KfdVersion>,
    /// What the probe gives the user.
    pub yields: &'static str,
}

/// Every probe gpreempt knows. Prototypes are in the eBPF programs' comments.
pub const PROBES: &[ProbeSpec] = &[
    ProbeSpec {
        program: "create_queue_entry",
        function: "kfd_ioctl_create_queue",
        kind: ProbeKind::Kprobe,
        required: true,
        min_kfd: None,
        yields: "queue create: ioctl arguments pointer (kept for the return probe)",
    },
    ProbeSpec {
        program: "create_queue_return",
        function: "kfd_ioctl_create_queue",
        kind: ProbeKind::Kretprobe,
        required: true,
        min_kfd: None,
        yields: "queue create: queue id, gpu id, type, priority, ring, CWSR area, result",
    },
    ProbeSpec {
        program: "destroy_queue_entry",
        function: "kfd_ioctl_destroy_queue",
        kind: ProbeKind::Kprobe,
        required: true,
        min_kfd: None,
        yields: "queue destroy: ioctl arguments pointer",
    },
    ProbeSpec {
        program: "destroy_queue_return",
        function: "kfd_ioctl_destroy_queue",
        kind: ProbeKind::Kretprobe,
        required: true,
        min_kfd: None,
        yields: "queue destroy: queue id, result",
    },
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

/// Resolve every row of `table` in the module that provides KFD.
pub fn resolve(table: &[ProbeSpec], kallsyms: &Kallsyms, kfd: Option<KfdVersion>) -> Vec<ResolvedProbe> {
    let module = kallsyms.kfd_module().flatten();
    table
        .iter()
        .map(|spec| {
            let symbol = kallsyms.resolve(spec.function, module);
            let missing_reason = match (symbol, spec.min_kfd, kfd) {
                (Some(_), _, _) => None,
                (None, Some(min), Some(have)) if have < min => {
                    Some(format!("{} appeared in KFD {min}; this kernel has {have}", spec.function))
                }
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
                min_kfd: Some(KfdVersion { major: 1, minor: 13 }),
                yields: "",
            },
        ];
        let r = resolve(&table, &k, Some(KfdVersion { major: 1, minor: 11 }));
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
        assert_eq!(r[2].missing_reason.as_deref(), Some("suspend_queues appeared in KFD 1.13; this kernel has 1.11"));
    }
}
