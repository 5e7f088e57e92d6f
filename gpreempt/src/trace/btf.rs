//! Struct offsets from BTF, for the probes that must follow kernel pointers.
//!
//! `/sys/kernel/btf/vmlinux` is the base; `/sys/kernel/btf/<module>` (amdgpu, or whichever module
//! provides KFD) is *split* BTF whose type ids continue after the base's and whose string
//! offsets continue after the base's string section. This is a small self-contained reader
//! (the BTF format of `include/uapi/linux/btf.h`): enough to find a struct member's offset by
//! path (`queue.properties.queue_id`, descending into anonymous members) and a function's
//! parameter types. Without module BTF (common with amdgpu-dkms) the tracer falls back to
//! pointer learning ([`OffsetMode::PointerLearning`]).

use std::{collections::HashMap, fs, path::Path};

use gpreempt_common::record::{OFFSET_UNKNOWN, ProbeConfig};
use serde::Serialize;

const MAGIC: u16 = 0xeb9f;

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{what}: not BTF (bad magic or header)")]
    BadHeader { what: String },
    #[error("{what}: truncated at byte {at}")]
    Truncated { what: String, at: usize },
    #[error("{what}: unknown BTF kind {kind} at type {id}")]
    UnknownKind { what: String, kind: u32, id: u32 },
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Member {
    /// Offset into [`Btf::strings`] (names are resolved only when compared: vmlinux has
    /// hundreds of thousands of members and the tracer may start under slow emulation).
    name: u32,
    type_id: u32,
    bit_offset: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Type {
    /// Struct or union.
    Composite {
        name: u32,
        members: Vec<Member>,
    },
    /// Ptr, typedef, const, volatile, restrict, type tag: `type_id` is what it refers to.
    Ref {
        kind: u32,
        name: u32,
        type_id: u32,
    },
    Func {
        proto: u32,
    },
    Proto {
        params: Vec<u32>,
    },
    Other {
        name: u32,
    },
}

/// Parsed BTF: the base (vmlinux) plus optional split (module) types in one id space.
#[derive(Debug, Default)]
pub struct Btf {
    /// Index 0 is the `void` type.
    types: Vec<Type>,
    /// Struct, union and function names → type ids (the only kinds looked up by name).
    by_name: HashMap<String, Vec<u32>>,
    /// Base strings followed by split strings: split BTF's string offsets continue the base's,
    /// so one concatenated table serves both.
    strings: Vec<u8>,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

struct Section<'a> {
    types: &'a [u8],
    strings: &'a [u8],
}

fn sections<'a>(data: &'a [u8], what: &str) -> Result<Section<'a>, BtfError> {
    let bad = || BtfError::BadHeader { what: what.to_owned() };
    // Only little-endian BTF (x86-64, arm64) is supported.
    if u16_at(data, 0) != Some(MAGIC) {
        return Err(bad());
    }
    let hdr_len = u32_at(data, 4).ok_or_else(bad)? as usize;
    let type_off = u32_at(data, 8).ok_or_else(bad)? as usize;
    let type_len = u32_at(data, 12).ok_or_else(bad)? as usize;
    let str_off = u32_at(data, 16).ok_or_else(bad)? as usize;
    let str_len = u32_at(data, 20).ok_or_else(bad)? as usize;
    let slice = |off: usize, len: usize| {
        let start = hdr_len.checked_add(off)?;
        data.get(start..start.checked_add(len)?)
    };
    Ok(Section { types: slice(type_off, type_len).ok_or_else(bad)?, strings: slice(str_off, str_len).ok_or_else(bad)? })
}

impl Btf {
    /// Parse base BTF (`/sys/kernel/btf/vmlinux`).
    pub fn parse(base: &[u8]) -> Result<Self, BtfError> {
        let mut btf = Btf { types: vec![Type::Other { name: 0 }], ..Default::default() };
        btf.add(base, "vmlinux")?;
        Ok(btf)
    }

    /// Parse base BTF plus one split BTF on top of it (a module's `/sys/kernel/btf/<module>`).
    pub fn parse_split(base: &[u8], split: &[u8], what: &str) -> Result<Self, BtfError> {
        let mut btf = Self::parse(base)?;
        btf.add(split, what)?;
        Ok(btf)
    }

    /// Load vmlinux BTF and, when `module` is given and has BTF, its split BTF.
    pub fn load(btf_dir: &Path, module: Option<&str>) -> Result<Self, BtfError> {
        let read = |name: &str| {
            let path = btf_dir.join(name);
            fs::read(&path).map_err(|e| BtfError::Read { path: path.display().to_string(), reason: e.to_string() })
        };
        let base = read("vmlinux")?;
        match module {
            Some(m) => Self::parse_split(&base, &read(m)?, m),
            None => Self::parse(&base),
        }
    }

    /// The string at `off` of the combined table ("" when out of range or not UTF-8).
    fn name(&self, off: u32) -> &str {
        let bytes = self.strings.get(off as usize..).unwrap_or(&[]);
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        std::str::from_utf8(&bytes[..end]).unwrap_or("")
    }

    fn add(&mut self, data: &[u8], what: &str) -> Result<(), BtfError> {
        let sec = sections(data, what)?;
        self.strings.extend_from_slice(sec.strings);
        let t = sec.types;
        let mut at = 0usize;
        while at < t.len() {
            let id = self.types.len() as u32;
            let truncated = || BtfError::Truncated { what: what.to_owned(), at };
            let name = u32_at(t, at).ok_or_else(truncated)?;
            let info = u32_at(t, at + 4).ok_or_else(truncated)?;
            let size_or_type = u32_at(t, at + 8).ok_or_else(truncated)?;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 == 1;
            let body = at + 12;
            let (ty, extra) = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => (Type::Other { name }, 4),
                KIND_ARRAY => (Type::Other { name }, 12),
                KIND_ENUM => (Type::Other { name }, 8 * vlen),
                KIND_ENUM64 | KIND_DATASEC => (Type::Other { name }, 12 * vlen),
                KIND_FWD | KIND_FLOAT => (Type::Other { name }, 0),
                KIND_PTR | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    (Type::Ref { kind, name, type_id: size_or_type }, 0)
                }
                KIND_FUNC => (Type::Func { proto: size_or_type }, 0),
                KIND_FUNC_PROTO => {
                    let mut params = Vec::with_capacity(vlen);
                    for i in 0..vlen {
                        params.push(u32_at(t, body + 8 * i + 4).ok_or_else(truncated)?);
                    }
                    (Type::Proto { params }, 8 * vlen)
                }
                KIND_STRUCT | KIND_UNION => {
                    let mut members = Vec::with_capacity(vlen);
                    for i in 0..vlen {
                        let m = body + 12 * i;
                        let offset = u32_at(t, m + 8).ok_or_else(truncated)?;
                        members.push(Member {
                            name: u32_at(t, m).ok_or_else(truncated)?,
                            type_id: u32_at(t, m + 4).ok_or_else(truncated)?,
                            // With kind_flag the top 8 bits are a bitfield size.
                            bit_offset: if kind_flag { offset & 0x00ff_ffff } else { offset },
                        });
                    }
                    (Type::Composite { name, members }, 12 * vlen)
                }
                unknown => return Err(BtfError::UnknownKind { what: what.to_owned(), kind: unknown, id }),
            };
            if matches!(kind, KIND_STRUCT | KIND_UNION | KIND_FUNC) && name != 0 {
                let text = self.name(name);
                if !text.is_empty() {
                    let text = text.to_owned();
                    self.by_name.entry(text).or_default().push(id);
                }
            }
            self.types.push(ty);
            at = body + extra;
        }
        Ok(())
    }

    /// Follow typedefs and qualifiers (not pointers) to the underlying type.
    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.types.get(id as usize) {
                Some(Type::Ref { kind, type_id, .. }) if *kind != KIND_PTR => id = *type_id,
                _ => break,
            }
        }
        id
    }

    fn composite(&self, name: &str) -> Option<&[Member]> {
        // A struct may appear more than once (base and module); take the first with members.
        self.by_name.get(name)?.iter().find_map(|&id| match self.types.get(id as usize) {
            Some(Type::Composite { members, .. }) if !members.is_empty() => Some(members.as_slice()),
            _ => None,
        })
    }

    /// Find `name` among `members`, descending into anonymous struct/union members.
    fn find_member(&self, members: &[Member], name: &str, depth: u32) -> Option<(u32, u32)> {
        for m in members {
            if self.name(m.name) == name {
                return Some((m.bit_offset, m.type_id));
            }
        }
        if depth > 8 {
            return None;
        }
        for m in members.iter().filter(|m| self.name(m.name).is_empty()) {
            if let Some(Type::Composite { members: inner, .. }) = self.types.get(self.resolve(m.type_id) as usize)
                && let Some((off, ty)) = self.find_member(inner, name, depth + 1)
            {
                return Some((m.bit_offset + off, ty));
            }
        }
        None
    }

    /// Byte offset of `path` (`properties.queue_id`) inside struct `strukt` (`queue`).
    pub fn member_offset(&self, strukt: &str, path: &str) -> Option<u32> {
        let mut members = self.composite(strukt)?;
        let mut bits = 0u32;
        let mut parts = path.split('.').peekable();
        while let Some(part) = parts.next() {
            let (off, ty) = self.find_member(members, part, 0)?;
            bits = bits.checked_add(off)?;
            if parts.peek().is_some() {
                match self.types.get(self.resolve(ty) as usize)? {
                    Type::Composite { members: inner, .. } => members = inner,
                    _ => return None,
                }
            }
        }
        bits.is_multiple_of(8).then_some(bits / 8)
    }

    /// The name of parameter `index` of function `func`'s type: the struct name behind a
    /// pointer (`task_struct*`), else the type's own name (`pid_t`, `u64`).
    pub fn param_type_name(&self, func: &str, index: usize) -> Option<String> {
        let proto = self.by_name.get(func)?.iter().find_map(|&id| match self.types.get(id as usize) {
            Some(Type::Func { proto }) => Some(*proto),
            _ => None,
        })?;
        let Some(Type::Proto { params }) = self.types.get(proto as usize) else { return None };
        let mut id = *params.get(index)?;
        let mut pointer = false;
        for _ in 0..32 {
            match self.types.get(id as usize)? {
                Type::Ref { kind: KIND_PTR, type_id, .. } => {
                    pointer = true;
                    id = *type_id;
                }
                Type::Ref { kind: KIND_TYPEDEF, name, .. } if !pointer => return Some(self.name(*name).to_owned()),
                Type::Ref { type_id, .. } => id = *type_id,
                Type::Composite { name, .. } | Type::Other { name } => {
                    let name = self.name(*name);
                    return Some(if pointer { format!("{name}*") } else { name.to_owned() });
                }
                _ => return None,
            }
        }
        None
    }
}

/// How the probes find owners and gpu ids.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OffsetMode {
    /// Module BTF found: `p->lead_thread->tgid`, `dqm->dev->id` etc. are read directly.
    Btf { module: String },
    /// No module BTF: owners from `kfd_create_process` learned in ioctl context, gpu ids unknown
    /// in kworker probes.
    PointerLearning { reason: String },
}

impl std::fmt::Display for OffsetMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Btf { module } => write!(f, "BTF offsets from /sys/kernel/btf/{module}"),
            Self::PointerLearning { reason } => write!(f, "pointer learning ({reason})"),
        }
    }
}

/// The layout-free defaults (docs/kfd.md §3.3: stable on 6.1/6.12 and the newest tree).
pub fn default_config() -> ProbeConfig {
    ProbeConfig::DEFAULT
}

/// Offsets from `btf`; fields it cannot answer keep the layout-free defaults.
pub fn config_from(btf: &Btf) -> ProbeConfig {
    let mut c = default_config();
    let opt = |v: Option<u32>| v.unwrap_or(OFFSET_UNKNOWN);
    c.process_lead_thread = opt(btf.member_offset("kfd_process", "lead_thread"));
    c.task_tgid = opt(btf.member_offset("task_struct", "tgid"));
    c.process_release_work = opt(btf.member_offset("kfd_process", "release_work"));
    c.process_context_id = opt(btf.member_offset("kfd_process", "context_id"));
    // The context a /dev/kfd file holds, which CREATE_PROCESS replaces (vmlinux BTF).
    c.file_private_data = opt(btf.member_offset("file", "private_data"));
    c.qpd_pqm = btf.member_offset("qcm_process_device", "pqm").unwrap_or(c.qpd_pqm);
    c.pqm_process = btf.member_offset("process_queue_manager", "process").unwrap_or(c.pqm_process);
    c.dqm_dev = opt(btf.member_offset("device_queue_manager", "dev"));
    // `struct kfd_node` since 6.5 (multi-partition); `struct kfd_dev` on 6.1.
    let node_struct = btf
        .param_type_name("kfd_smi_event_queue_eviction", 0)
        .map(|n| n.trim_end_matches('*').to_owned())
        .unwrap_or_else(|| "kfd_node".to_owned());
    c.node_id = opt(btf.member_offset(&node_struct, "id").or_else(|| btf.member_offset("kfd_dev", "id")));
    c.queue_queue_id = btf.member_offset("queue", "properties.queue_id").unwrap_or(c.queue_queue_id);
    c.create_process_takes_task =
        u32::from(btf.param_type_name("kfd_create_process", 0).as_deref() == Some("task_struct*"));
    c.fence_wait_takes_dqm =
        u32::from(btf.param_type_name("amdkfd_fence_wait_timeout", 0).as_deref() == Some("device_queue_manager*"));
    // Released kernels pass `pid_t`; a pending patch passes `struct task_struct *`.
    c.smi_arg_is_pid =
        u32::from(btf.param_type_name("kfd_smi_event_queue_eviction", 1).as_deref() != Some("task_struct*"));
    c
}

/// Offsets for the running kernel, and which mode they put the tracer in.
pub fn discover(btf_dir: &Path, kfd_module: Option<&str>) -> (ProbeConfig, OffsetMode) {
    let module = kfd_module.unwrap_or("vmlinux");
    match Btf::load(btf_dir, kfd_module) {
        Ok(btf) => {
            let c = config_from(&btf);
            if c.process_lead_thread == OFFSET_UNKNOWN || c.dqm_dev == OFFSET_UNKNOWN {
                let reason = format!("{module} BTF lacks struct kfd_process / device_queue_manager");
                (c, OffsetMode::PointerLearning { reason })
            } else {
                (c, OffsetMode::Btf { module: module.to_owned() })
            }
        }
        Err(e) => {
            // vmlinux alone still gives task_struct.tgid.
            let mut c = default_config();
            if let Ok(base) = Btf::load(btf_dir, None) {
                c.task_tgid = base.member_offset("task_struct", "tgid").unwrap_or(OFFSET_UNKNOWN);
            }
            (c, OffsetMode::PointerLearning { reason: format!("no module BTF: {e}") })
        }
    }
}

/// Offsets as `name = value` pairs for the startup line and `doctor` (unknown shown as `?`).
pub fn describe(c: &ProbeConfig) -> String {
    let show = |v: u32| {
        if v == OFFSET_UNKNOWN { "?".to_owned() } else { v.to_string() }
    };
    format!(
        "kfd_process.lead_thread={} task_struct.tgid={} kfd_process.release_work={} \
         device_queue_manager.dev={} kfd_node.id={} queue.properties.queue_id={} \
         create_process(task)={} fence_wait(dqm)={} smi(pid)={} file.private_data={} kfd_process.context_id={}",
        show(c.process_lead_thread),
        show(c.task_tgid),
        show(c.process_release_work),
        show(c.dqm_dev),
        show(c.node_id),
        show(c.queue_queue_id),
        c.create_process_takes_task,
        c.fence_wait_takes_dqm,
        c.smi_arg_is_pid,
        show(c.file_private_data),
        show(c.process_context_id),
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a BTF blob from (kind, name, info extra, size_or_type, trailing words).
    pub(crate) struct Builder {
        strings: Vec<u8>,
        types: Vec<u8>,
    }

    impl Builder {
        pub(crate) fn new() -> Self {
            Self { strings: vec![0], types: Vec::new() }
        }
        fn string(&mut self, s: &str) -> u32 {
            if s.is_empty() {
                return 0;
            }
            let off = self.strings.len() as u32;
            self.strings.extend_from_slice(s.as_bytes());
            self.strings.push(0);
            off
        }
        fn word(&mut self, w: u32) {
            self.types.extend_from_slice(&w.to_le_bytes());
        }
        pub(crate) fn int(&mut self, name: &str) -> &mut Self {
            let n = self.string(name);
            self.word(n);
            self.word(KIND_INT << 24);
            self.word(4);
            self.word(32);
            self
        }
        pub(crate) fn ptr(&mut self, to: u32) -> &mut Self {
            self.word(0);
            self.word(KIND_PTR << 24);
            self.word(to);
            self
        }
        pub(crate) fn typedef(&mut self, name: &str, to: u32) -> &mut Self {
            let n = self.string(name);
            self.word(n);
            self.word(KIND_TYPEDEF << 24);
            self.word(to);
            self
        }
        /// members: (name, type id, bit offset)
        pub(crate) fn strukt(&mut self, name: &str, size: u32, members: &[(&str, u32, u32)]) -> &mut Self {
            let n = self.string(name);
            self.word(n);
            self.word((KIND_STRUCT << 24) | members.len() as u32);
            self.word(size);
            for (m, ty, off) in members {
                let mn = self.string(m);
                self.word(mn);
                self.word(*ty);
                self.word(*off);
            }
            self
        }
        pub(crate) fn build(&self) -> Vec<u8> {
            let mut out = Vec::new();
            out.extend_from_slice(&MAGIC.to_le_bytes());
            out.push(1);
            out.push(0);
            for w in [24u32, 0, self.types.len() as u32, self.types.len() as u32, self.strings.len() as u32] {
                out.extend_from_slice(&w.to_le_bytes());
            }
            out.extend_from_slice(&self.types);
            out.extend_from_slice(&self.strings);
            out
        }
    }

    #[test]
    fn member_paths_descend_into_nested_and_anonymous_structs() {
        // 1 int, 2 queue_properties{type@0, queue_id@64}, 3 anon{lead_thread@0}, 4 queue{list@0, properties@320}
        // 5 kfd_process{mutex@0, <anon 3>@768}
        let mut b = Builder::new();
        b.int("int")
            .strukt("queue_properties", 16, &[("type", 1, 0), ("queue_id", 1, 64)])
            .strukt("", 8, &[("lead_thread", 1, 0)])
            .strukt("queue", 64, &[("list", 1, 0), ("properties", 2, 320)])
            .strukt("kfd_process", 2024, &[("mutex", 1, 0), ("", 3, 768)]);
        let btf = Btf::parse(&b.build()).unwrap();
        assert_eq!(btf.member_offset("queue", "properties.queue_id"), Some(48));
        assert_eq!(btf.member_offset("queue", "properties.type"), Some(40));
        assert_eq!(btf.member_offset("kfd_process", "lead_thread"), Some(96));
        assert_eq!(btf.member_offset("kfd_process", "nope"), None);
        assert_eq!(btf.member_offset("nope", "x"), None);
    }

    #[test]
    fn split_btf_continues_ids_and_strings_of_the_base() {
        // Base: 1 int, 2 task_struct{pid@0, tgid@32}, 3 ptr->2, 4 typedef pid_t->1
        let mut base = Builder::new();
        base.int("int").strukt("task_struct", 8, &[("pid", 1, 0), ("tgid", 1, 32)]).ptr(2).typedef("pid_t", 1);
        let base_bytes = base.build();
        // Split: ids start at 5, string offsets after the base's strings.
        let mut split = Builder::new();
        split.strings.clear();
        let base_len = base.strings.len();
        // Pad the split's string offsets by the base's length by building names manually.
        let name = |s: &str, split: &mut Builder| {
            let off = (base_len + split.strings.len()) as u32;
            split.strings.extend_from_slice(s.as_bytes());
            split.strings.push(0);
            off
        };
        // 5 struct kfd_process { lead_thread: task_struct* @ 768 }
        let kp = name("kfd_process", &mut split);
        let lt = name("lead_thread", &mut split);
        for w in [kp, (KIND_STRUCT << 24) | 1, 2024, lt, 3, 768] {
            split.word(w);
        }
        // 6 proto(task_struct*, pid_t), 7 func kfd_create_process -> 6
        for w in [0, (KIND_FUNC_PROTO << 24) | 2, 1, 0, 3, 0, 4] {
            split.word(w);
        }
        let f = name("kfd_create_process", &mut split);
        for w in [f, KIND_FUNC << 24, 6] {
            split.word(w);
        }
        let btf = Btf::parse_split(&base_bytes, &split.build(), "amdgpu").unwrap();
        assert_eq!(btf.member_offset("kfd_process", "lead_thread"), Some(96));
        assert_eq!(btf.member_offset("task_struct", "tgid"), Some(4));
        assert_eq!(btf.param_type_name("kfd_create_process", 0).as_deref(), Some("task_struct*"));
        assert_eq!(btf.param_type_name("kfd_create_process", 1).as_deref(), Some("pid_t"));
        assert_eq!(btf.param_type_name("kfd_create_process", 2), None);
        let c = config_from(&btf);
        assert_eq!((c.process_lead_thread, c.task_tgid, c.create_process_takes_task), (96, 4, 1));
        assert_eq!((c.qpd_pqm, c.pqm_process, c.queue_queue_id, c.smi_arg_is_pid), (8, 0, 48, 1));
    }

    #[test]
    fn a_first_member_is_found_at_offset_0_and_a_missing_one_is_unknown() {
        // The emulator's layout: `dev` and `id` are first members (offset 0); kfd_process has no
        // release_work. 1 int, 2 kfd_node{id@0}, 3 ptr->2, 4 device_queue_manager{dev@0},
        // 5 kfd_process{lead_thread@0}.
        let mut b = Builder::new();
        b.int("int")
            .strukt("kfd_node", 16, &[("id", 1, 0), ("node_id", 1, 32)])
            .ptr(2)
            .strukt("device_queue_manager", 64, &[("dev", 3, 0), ("active_queue_count", 1, 64)])
            .strukt("kfd_process", 64, &[("lead_thread", 3, 0)]);
        let c = config_from(&Btf::parse(&b.build()).unwrap());
        assert_eq!((c.dqm_dev, c.node_id, c.process_lead_thread), (0, 0, 0));
        assert_eq!((c.process_release_work, c.task_tgid), (OFFSET_UNKNOWN, OFFSET_UNKNOWN));
        let text = describe(&c);
        assert!(text.contains("device_queue_manager.dev=0 kfd_node.id=0"), "{text}");
        assert!(text.contains("kfd_process.lead_thread=0 task_struct.tgid=? kfd_process.release_work=?"), "{text}");
        // No context_id before Linux 7.0: every queue record names the primary context.
        assert_eq!(c.process_context_id, OFFSET_UNKNOWN);
        assert!(text.ends_with("kfd_process.context_id=?"), "{text}");
    }

    /// Linux 7.0's `kfd_process.context_id` (a u16 at byte 2074 of 2096 in Debian 7.3.4's module
    /// BTF, docs/kfd.md §1.4): the programs read it to leave secondary contexts out.
    #[test]
    fn the_context_id_of_a_7_x_kfd_process_is_found() {
        let mut b = Builder::new();
        b.int("int").ptr(1).strukt("kfd_process", 2096, &[("lead_thread", 2, 88 * 8), ("context_id", 1, 2074 * 8)]);
        // With `struct file` (vmlinux; an offset for the test) the tracer reads a new context's id.
        b.strukt("file", 256, &[("private_data", 2, 200 * 8)]);
        let c = config_from(&Btf::parse(&b.build()).unwrap());
        assert_eq!((c.process_lead_thread, c.process_context_id, c.file_private_data), (88, 2074, 200));
        assert!(describe(&c).ends_with("file.private_data=200 kfd_process.context_id=2074"), "{}", describe(&c));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(matches!(Btf::parse(b"nope"), Err(BtfError::BadHeader { .. })));
        let mut b = Builder::new();
        b.int("int");
        let mut bytes = b.build();
        // Claim more type bytes than present.
        bytes[12..16].copy_from_slice(&100u32.to_le_bytes());
        assert!(Btf::parse(&bytes).is_err());
        let (c, mode) = discover(Path::new("/nonexistent"), Some("amdgpu"));
        assert_eq!(c, default_config());
        assert!(matches!(mode, OffsetMode::PointerLearning { .. }));
    }

    // The real BTF of Debian 6.1 and 6.12 is read in the VM: tests/tests/trace_btf.rs.
}
