//! Resolving KFD function names against `/proc/kallsyms`.
//!
//! Static KFD functions may be emitted under a suffixed name (`execute_queues_cpsch.constprop.0`
//! on Debian 6.12.117), inlined away, or built into a module other than `amdgpu` (DKMS builds, the
//! test emulator). A function is found by its exact name or a `.constprop.N` / `.isra.N` /
//! `.part.N` variant; `.cold` fragments are never probe targets.

use std::{collections::HashMap, fs, io, path::Path};

/// Where kallsyms lives.
pub const KALLSYMS: &str = "/proc/kallsyms";

/// One text symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    /// Full name as the kernel knows it, e.g. `execute_queues_cpsch.constprop.0`.
    pub name: String,
    pub address: u64,
    /// Providing module, `None` for the kernel image.
    pub module: Option<String>,
}

/// Text symbols indexed by their base name (the name without compiler suffixes).
#[derive(Debug, Default)]
pub struct Kallsyms {
    by_base: HashMap<String, Vec<Symbol>>,
}

#[derive(Debug, thiserror::Error)]
pub enum SymbolsError {
    #[error("cannot read {path}: {cause}")]
    Read { path: String, cause: io::Error },
    #[error("{KALLSYMS} shows only zero addresses: run as root (kernel.kptr_restrict hides them from other users)")]
    Hidden,
}

/// The base name of a symbol and whether it may be probed: `foo.constprop.0` → (`foo`, true),
/// `foo.cold` → (`foo`, false).
pub fn base_name(name: &str) -> (&str, bool) {
    let mut base = name;
    let mut probeable = true;
    while let Some((head, tail)) = base.rsplit_once('.') {
        let is_counter = !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit());
        match tail {
            "constprop" | "isra" | "part" | "localalias" => {}
            "cold" => probeable = false,
            _ if is_counter => {}
            _ => break,
        }
        base = head;
    }
    (base, probeable)
}

impl Kallsyms {
    pub fn load() -> Result<Self, SymbolsError> {
        Self::load_path(Path::new(KALLSYMS))
    }

    pub fn load_path(path: &Path) -> Result<Self, SymbolsError> {
        let text = fs::read_to_string(path)
            .map_err(|source| SymbolsError::Read { path: path.display().to_string(), cause: source })?;
        let symbols = Self::parse(&text);
        if !symbols.by_base.is_empty() && symbols.by_base.values().flatten().all(|s| s.address == 0) {
            return Err(SymbolsError::Hidden);
        }
        Ok(symbols)
    }

    /// Parses kallsyms text: `ffffffffc0c6ab80 t execute_queues_cpsch.constprop.0\t[amdgpu]`.
    /// Only text symbols (`t`/`T`) are kept; malformed lines are skipped.
    pub fn parse(text: &str) -> Self {
        let mut by_base: HashMap<String, Vec<Symbol>> = HashMap::new();
        for line in text.lines() {
            let mut fields = line.split_whitespace();
            let (Some(address), Some(kind), Some(name)) = (fields.next(), fields.next(), fields.next()) else {
                continue;
            };
            if !matches!(kind, "t" | "T") {
                continue;
            }
            let Ok(address) = u64::from_str_radix(address, 16) else { continue };
            let module = fields.next().and_then(|m| m.strip_prefix('[')).and_then(|m| m.strip_suffix(']'));
            let (base, probeable) = base_name(name);
            if !probeable {
                continue;
            }
            by_base.entry(base.to_owned()).or_default().push(Symbol {
                name: name.to_owned(),
                address,
                module: module.map(str::to_owned),
            });
        }
        Self { by_base }
    }

    /// The symbol to attach to for `function`: the exact name if present, else the first
    /// suffixed variant. When `module` is given, only symbols of that module count.
    pub fn resolve(&self, function: &str, module: Option<&str>) -> Option<&Symbol> {
        let candidates = self.by_base.get(function)?;
        let in_module = |s: &&Symbol| module.is_none() || s.module.as_deref() == module;
        candidates
            .iter()
            .filter(in_module)
            .find(|s| s.name == function)
            .or_else(|| candidates.iter().filter(in_module).min_by(|a, b| a.name.cmp(&b.name)))
    }

    /// Every symbol a base name has (e.g. two `suspend_queues` in different modules).
    pub fn variants(&self, function: &str) -> &[Symbol] {
        self.by_base.get(function).map_or(&[], Vec::as_slice)
    }

    /// The module that provides KFD: the one with `kfd_ioctl` (amdgpu, or a DKMS/emulator
    /// module). `Some(None)` means built into the kernel image.
    pub fn kfd_module(&self) -> Option<Option<&str>> {
        self.variants("kfd_ioctl").first().map(|s| s.module.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
ffffffffc0c6ab80 t execute_queues_cpsch.constprop.0\t[amdgpu]
ffffffffc0c6b000 t kfd_ioctl_create_queue\t[amdgpu]
ffffffffc0c6b100 t kfd_ioctl\t[amdgpu]
ffffffffc0c6b200 t unmap_queues_cpsch.isra.0\t[amdgpu]
ffffffffc0c6b300 t unmap_queues_cpsch.cold\t[amdgpu]
ffffffffc0d00000 t suspend_queues\t[amdgpu]
ffffffffc1d00000 t suspend_queues\t[kfd_emu]
ffffffff81000000 T _stext
ffffffffc0c6b400 d kfd_ioctl_data\t[amdgpu]
garbage
";

    #[test]
    fn base_names_strip_compiler_suffixes() {
        assert_eq!(base_name("execute_queues_cpsch.constprop.0"), ("execute_queues_cpsch", true));
        assert_eq!(base_name("foo.isra.0.constprop.1"), ("foo", true));
        assert_eq!(base_name("foo.part.3"), ("foo", true));
        assert_eq!(base_name("foo.cold"), ("foo", false));
        assert_eq!(base_name("kfd_ioctl"), ("kfd_ioctl", true));
    }

    #[test]
    fn resolves_exact_names_and_variants_and_skips_cold_and_data() {
        let k = Kallsyms::parse(SAMPLE);
        let s = k.resolve("execute_queues_cpsch", None).unwrap();
        assert_eq!(s.name, "execute_queues_cpsch.constprop.0");
        assert_eq!(s.address, 0xffffffffc0c6ab80);
        assert_eq!(s.module.as_deref(), Some("amdgpu"));
        assert_eq!(k.resolve("unmap_queues_cpsch", None).unwrap().name, "unmap_queues_cpsch.isra.0");
        assert_eq!(k.variants("unmap_queues_cpsch").len(), 1, ".cold is not a probe target");
        assert!(k.resolve("kfd_ioctl_data", None).is_none(), "data symbols are not functions");
        assert!(k.resolve("map_queues_cpsch", None).is_none());
        assert_eq!(k.resolve("_stext", None).unwrap().module, None);
    }

    #[test]
    fn module_filter_picks_the_kfd_provider() {
        let k = Kallsyms::parse(SAMPLE);
        assert_eq!(k.kfd_module(), Some(Some("amdgpu")));
        assert_eq!(k.variants("suspend_queues").len(), 2);
        assert_eq!(k.resolve("suspend_queues", Some("kfd_emu")).unwrap().address, 0xffffffffc1d00000);
        assert_eq!(k.resolve("suspend_queues", Some("amdgpu")).unwrap().address, 0xffffffffc0d00000);
        assert!(Kallsyms::parse("").kfd_module().is_none());
    }
}
