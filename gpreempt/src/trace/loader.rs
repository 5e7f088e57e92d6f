//! Loads the embedded eBPF object and attaches every resolved probe.

use aya::{
    Ebpf, EbpfLoader,
    programs::{KProbe, ProgramError},
};

use gpreempt_common::record::{CONFIG_GLOBAL, ProbeConfig};

use super::{
    btf::{self, OffsetMode},
    missed::{MissedSupport, ReturnProbeLinks},
    probes::{self, ProbeKind, ProbeSpec, ResolvedProbe},
    symbols::{Kallsyms, SymbolsError},
};
use crate::kfd::KfdVersion;

/// The eBPF object built by `build.rs` (empty when built with `AYA_BUILD_SKIP=1`).
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gpreempt"));

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    // The installed binary is what a user runs (docs/install.md), not a source tree's xtask.
    #[error(
        "the KFD tracer needs root (CAP_BPF and CAP_PERFMON): run gpreempt with sudo, or grant it those capabilities"
    )]
    NotRoot,
    #[error("this gpreempt binary was built with AYA_BUILD_SKIP=1 and has no eBPF programs: rebuild without it")]
    NoObject,
    #[error(transparent)]
    Symbols(#[from] SymbolsError),
    #[error("no KFD functions in /proc/kallsyms: load the amdgpu driver (`modprobe amdgpu`) first")]
    NoKfd,
    #[error("required probe {program} cannot attach: {reason}")]
    RequiredMissing { program: &'static str, reason: String },
    #[error("loading the eBPF object failed: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("eBPF program {program} not found in the object (the object and the probe table disagree)")]
    NoProgram { program: &'static str },
    #[error("eBPF program {program}: {cause}")]
    Program { program: &'static str, cause: ProgramError },
    #[error("eBPF program {program}: {cause}{hint}")]
    Attach { program: &'static str, cause: ProgramError, hint: String },
}

/// The errno of a failed attach and, when this host's settings explain it, the cause and the fix.
fn attach_hint(cause: &ProgramError) -> String {
    let errno = std::error::Error::source(cause)
        .and_then(|e| e.downcast_ref::<std::io::Error>())
        .and_then(std::io::Error::raw_os_error);
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").ok();
    let caps = std::fs::read_to_string("/proc/self/status").ok();
    let has_sys_admin =
        caps.as_deref().and_then(crate::host::procinfo::effective_caps).is_some_and(|c| c & (1 << 21) != 0);
    hint_for(errno, paranoid.as_deref().and_then(|p| p.trim().parse().ok()), has_sys_admin)
}

/// See [`attach_hint`]. Debian's and Ubuntu's kernels carry a patch that adds
/// `kernel.perf_event_paranoid` levels above 2 (Debian's default is 3) at which perf_event_open(2)
/// checks CAP_SYS_ADMIN itself, not CAP_PERFMON (kernel/events/core.c, `perf_paranoid_any()`;
/// observed on Debian 6.12.117: EACCES with CAP_PERFMON at 3, attached at 2).
fn hint_for(errno: Option<i32>, paranoid: Option<i32>, has_sys_admin: bool) -> String {
    let Some(errno) = errno else { return String::new() };
    let os = std::io::Error::from_raw_os_error(errno);
    match paranoid {
        Some(level) if level > 2 && errno == libc::EACCES && !has_sys_admin => format!(
            " ({os}): kernel.perf_event_paranoid is {level}, at which Debian's and Ubuntu's kernels allow \
             perf_event_open(2) only with CAP_SYS_ADMIN, CAP_PERFMON or not; set it to 2 on the host \
             (`sysctl -w kernel.perf_event_paranoid=2`, and a file in /etc/sysctl.d to keep it) or run \
             gpreempt with CAP_SYS_ADMIN"
        ),
        _ => format!(" ({os})"),
    }
}

/// The loaded programs with their attachments; dropping it detaches everything.
pub struct AttachedProbes {
    pub ebpf: Ebpf,
    pub probes: Vec<ResolvedProbe>,
    /// The module that provides KFD (`amdgpu`, a DKMS build, or the test emulator).
    pub kfd_module: Option<String>,
    /// The struct offsets passed to the programs, and where they came from.
    pub offsets: ProbeConfig,
    pub offset_mode: OffsetMode,
    /// Start-up time: kallsyms resolution, BTF offsets, object load + attach (ms).
    pub startup_ms: [u64; 3],
    /// The links of the attached return probes, for their missed hits ([`super::missed`]).
    pub return_links: ReturnProbeLinks,
}

impl AttachedProbes {
    pub fn attached_count(&self) -> usize {
        self.probes.iter().filter(|p| p.symbol.is_some()).count()
    }
}

/// Resolve `table` against kallsyms, read struct offsets from the BTF in `btf_dir` (normally
/// [`BTF_DIR`]), load the object and attach every probe that resolved.
pub fn attach(
    table: &[ProbeSpec],
    kfd: Option<KfdVersion>,
    btf_dir: &std::path::Path,
) -> Result<AttachedProbes, LoadError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(LoadError::NotRoot);
    }
    if EBPF_OBJECT.is_empty() {
        return Err(LoadError::NoObject);
    }
    let started = std::time::Instant::now();
    let kallsyms = Kallsyms::load()?;
    let kfd_module = kallsyms.kfd_module().ok_or(LoadError::NoKfd)?.map(str::to_owned);
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok();
    let resolved = probes::resolve(table, &kallsyms, kfd, release.as_deref().map(str::trim));
    if let Some(p) = resolved.iter().find(|p| p.required && p.symbol.is_none()) {
        return Err(LoadError::RequiredMissing {
            program: p.program,
            reason: p.missing_reason.clone().unwrap_or_default(),
        });
    }

    let kallsyms_ms = started.elapsed().as_millis() as u64;
    let (offsets, offset_mode) = btf::discover(btf_dir, kfd_module.as_deref());
    let btf_ms = started.elapsed().as_millis() as u64 - kallsyms_ms;

    raise_memlock_limit();
    let mut ebpf = EbpfLoader::new().override_global(CONFIG_GLOBAL, &offsets, true).load(EBPF_OBJECT)?;
    let mut probes = resolved;
    let mut return_programs = Vec::new();
    for probe in &mut probes {
        let Some(symbol) = probe.symbol.clone() else { continue };
        let program = probe.program;
        let result = (|| -> Result<Option<u32>, LoadError> {
            let kprobe: &mut KProbe = ebpf
                .program_mut(program)
                .ok_or(LoadError::NoProgram { program })?
                .try_into()
                .map_err(|source| LoadError::Program { program, cause: source })?;
            kprobe.load().map_err(|source| LoadError::Program { program, cause: source })?;
            kprobe.attach(&symbol, 0).map_err(|cause| LoadError::Attach {
                program,
                hint: attach_hint(&cause),
                cause,
            })?;
            Ok(kprobe.info().map(|info| info.id()).ok())
        })();
        match result {
            Ok(id) => {
                if let (ProbeKind::Kretprobe, Some(id)) = (probe.kind, id) {
                    return_programs.push((program, id));
                }
            }
            // An optional probe the kernel refuses (blacklisted symbol, verifier) is reported.
            Err(e) if !probe.required => {
                probe.missing_reason = Some(format!("{symbol} resolved but attaching failed: {e}"));
                probe.symbol = None;
            }
            Err(e) => return Err(e),
        }
    }
    let return_links = ReturnProbeLinks::find(&return_programs, MissedSupport::running()).unwrap_or_else(|e| {
        log::warn!("cannot find the return probes' links, their missed hits stay unknown: {e}");
        ReturnProbeLinks::default()
    });
    let load_ms = started.elapsed().as_millis() as u64 - kallsyms_ms - btf_ms;
    Ok(AttachedProbes {
        ebpf,
        probes,
        kfd_module,
        offsets,
        offset_mode,
        startup_ms: [kallsyms_ms, btf_ms, load_ms],
        return_links,
    })
}

/// Where the kernel exposes BTF (vmlinux and one file per module).
pub const BTF_DIR: &str = "/sys/kernel/btf";

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; newer ones use memcg and ignore it.
fn raise_memlock_limit() {
    let unlimited = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: plain setrlimit call with a valid struct.
    let ret = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
    if ret != 0 {
        log::debug!("setrlimit(RLIMIT_MEMLOCK) failed: {}", std::io::Error::last_os_error());
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_attach_refused_for_perf_event_paranoid_names_the_setting_and_the_fix() {
        let hint = super::hint_for(Some(libc::EACCES), Some(3), false);
        assert!(hint.starts_with(" (Permission denied (os error 13)): kernel.perf_event_paranoid is 3,"), "{hint}");
        assert!(hint.contains("sysctl -w kernel.perf_event_paranoid=2"), "{hint}");
        for (paranoid, sys_admin) in [(Some(2), false), (Some(3), true), (None, false)] {
            assert_eq!(super::hint_for(Some(libc::EACCES), paranoid, sys_admin), " (Permission denied (os error 13))");
        }
        assert_eq!(super::hint_for(None, Some(3), false), "");
    }

    use super::*;

    /// The programs the embedded object defines (parsed, not loaded: no root needed).
    fn object_programs() -> Vec<String> {
        assert!(
            !EBPF_OBJECT.is_empty(),
            "this test binary was built with AYA_BUILD_SKIP=1: the embedded eBPF object is empty and cannot be checked"
        );
        let object = aya_obj::Object::parse(EBPF_OBJECT).expect("the embedded eBPF object parses");
        let mut names: Vec<String> = object.programs.keys().cloned().collect();
        names.sort();
        names
    }

    #[test]
    fn every_program_of_the_probe_tables_is_in_the_embedded_object() {
        let programs = object_programs();
        let tables = probes::PROBES.iter().chain(probes::FLOOR);
        let missing: Vec<&str> =
            tables.clone().map(|p| p.program).filter(|name| !programs.iter().any(|p| p == name)).collect();
        assert_eq!(missing, Vec::<&str>::new(), "programs named in the tables but absent from the object");
        // And nothing in the object that no table attaches.
        let unused: Vec<&String> = programs.iter().filter(|p| !tables.clone().any(|t| t.program == *p)).collect();
        assert_eq!(unused, Vec::<&String>::new(), "programs in the object that no table names");
        assert_eq!(programs.len(), probes::PROBES.len() + probes::FLOOR.len());
    }
}
