//! Parsers for the KFD debugfs files `/sys/kernel/debug/kfd/{mqds,hqds,rls}` (docs/kfd.md §4.2).
//!
//! All three files are line oriented `seq_file` output. The parsers accept the 6.1 forms, the 6.12 / amdgpu-dkms
//! multi-XCC forms (`Inst %d, …`) and the newer `Process %d PASID %d:` form, tolerate any amount of leading,
//! trailing and inner whitespace, skip blank lines, and report anything else as a [`DebugfsError`] naming the 1-based
//! line. They never panic, whatever the input (the files are read as root from a kernel we do not control and the
//! functions are fuzzed).

use std::collections::BTreeSet;
use std::str::SplitWhitespace;

use serde::Serialize;

use crate::domain::{GpuId, HostPid};

/// `seq_hex_dump(m, prefix, DUMP_PREFIX_OFFSET, 32, 4, …)` prints 32-byte rows of 4-byte groups, and `seq_reg_dump`
/// starts a new line after 1 + 7 values, so no dump line of these files holds more than 8 words (docs/kfd.md §4.2).
const MAX_WORDS_PER_LINE: usize = 8;

/// Errors quote at most this much of the offending line: a binary file or a fuzzer can hand us megabyte "lines".
const MAX_EXCERPT_CHARS: usize = 160;

/// A line the parser could not accept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
pub enum DebugfsError {
    /// The line matches none of the forms the file can contain at this point.
    #[error("line {line}: expected {expected}, found {text:?}")]
    Unexpected {
        /// 1-based line number.
        line: usize,
        /// The offending line (truncated to a short excerpt).
        text: String,
        /// What the parser accepts there.
        expected: &'static str,
    },
    /// A well-formed hex/register dump row that does not fit the dump it belongs to.
    #[error("line {line}: expected {expected}, found {text:?}")]
    BadDump {
        /// 1-based line number.
        line: usize,
        /// The offending line (truncated to a short excerpt).
        text: String,
        /// What the parser accepts there.
        expected: String,
    },
}

impl DebugfsError {
    /// 1-based number of the offending line.
    pub fn line(&self) -> usize {
        match self {
            Self::Unexpected { line, .. } | Self::BadDump { line, .. } => *line,
        }
    }

    /// Excerpt of the offending line.
    pub fn text(&self) -> &str {
        match self {
            Self::Unexpected { text, .. } | Self::BadDump { text, .. } => text,
        }
    }

    fn unexpected(line: usize, text: &str, expected: &'static str) -> Self {
        Self::Unexpected { line, text: excerpt(text), expected }
    }

    fn bad_dump(line: usize, text: &str, expected: String) -> Self {
        Self::BadDump { line, text: excerpt(text), expected }
    }
}

fn excerpt(text: &str) -> String {
    text.chars().take(MAX_EXCERPT_CHARS).collect()
}

// ---------------------------------------------------------------------------------------------------------------
// mqds
// ---------------------------------------------------------------------------------------------------------------

/// One `Process … PASID …:` block of `mqds` (`kfd_debugfs_mqds_by_process`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MqdProcess {
    /// The process' TGID.
    pub pid: HostPid,
    /// The PASID on 6.1/6.12 (`PASID 0x%x`); on newer kernels and amdgpu-dkms (`PASID %d`) the lead thread's pid,
    /// so equal to `pid` (docs/kfd.md §4.2, fixture README).
    pub second_field: u32,
    /// Queues in the kernel's pqm list order (newest first); there are no queue ids in this file.
    pub queues: Vec<MqdQueue>,
    /// `Weird: Queue node with neither kernel nor user queue` lines: a pqm node without a queue, printed with no
    /// device and no dump (`pqm_debugfs_mqds`), so not representable as an [`MqdQueue`].
    pub queueless_nodes: usize,
}

/// One queue header of `mqds` and the MQD dumps that follow it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MqdQueue {
    pub kind: MqdQueueKind,
    /// KFD gpu_id (printed in hex).
    pub gpu_id: GpuId,
    /// Number of MQD hex dumps: one per XCC for compute queues on multi-XCC GPUs (gfx9.4.3: 4 on MI300/MI308X), 1
    /// otherwise, 0 for `Bad … queue type` headers (the kernel `continue`s before dumping).
    pub dumps: usize,
}

/// The queue header forms of `pqm_debugfs_mqds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum MqdQueueKind {
    /// `Compute queue on device %x`.
    Compute,
    /// `SDMA queue on device %x` (SDMA and SDMA_XGMI queues).
    Sdma,
    /// `DIQ on device %x` (debug interface queue; gone from kernels that dropped kernel queues from the pqm).
    Diq,
    /// `Bad user queue type %d on device %x`: the raw queue type.
    Bad(u32),
    /// `Bad kernel queue type %d on device %x`: the raw queue type.
    BadKernel(u32),
}

/// Parses the text of `/sys/kernel/debug/kfd/mqds`.
///
/// Queues are counted by header line. A compute queue on a multi-XCC GPU is followed by one MQD dump per XCC; a new
/// dump is recognised by its row offset going back to `00000000`.
pub fn parse_mqds(text: &str) -> Result<Vec<MqdProcess>, DebugfsError> {
    let mut processes: Vec<MqdProcess> = Vec::new();
    // Whether dump rows may follow: only right after a header that the kernel follows with `debugfs_show_mqd`.
    let mut dump_allowed = false;
    // Offset the next row of the current dump must have (rows are contiguous); None before a dump has started.
    let mut next_offset: Option<u32> = None;

    for (index, raw) in text.lines().enumerate() {
        let line_no = index.saturating_add(1);
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }

        if let Some(row) = parse_dump_line(line).map_err(|what| DebugfsError::unexpected(line_no, raw, what))? {
            let queue = if dump_allowed { processes.last_mut().and_then(|p| p.queues.last_mut()) } else { None };
            let Some(queue) = queue else {
                return Err(DebugfsError::unexpected(
                    line_no,
                    raw,
                    "a `Compute/SDMA queue on device %x` or `DIQ on device %x` header before MQD dump rows",
                ));
            };
            if row.offset == 0 {
                // gfx9.4.3 prints one MQD per XCC back to back, each from offset 0 (docs/kfd.md §4.2).
                queue.dumps = queue.dumps.saturating_add(1);
            } else if next_offset != Some(row.offset) {
                return Err(DebugfsError::bad_dump(line_no, raw, continuation_expectation(next_offset)));
            }
            next_offset = row.offset.checked_add(row.byte_len());
            continue;
        }

        // 6.1/6.12 print `PASID 0x%x` (tgid, pasid); newer kernels `PASID %d` (tgid, pid) (docs/kfd.md §4.2), and so does
        // the amdgpu-dkms 6.12.12 driver of the MI308X fixture (`Process 94314 PASID 94314:`).
        if let Some([pid, second_field]) = match_line(line, "Process {d} PASID {p}:") {
            processes.push(MqdProcess { pid: HostPid(pid), second_field, queues: Vec::new(), queueless_nodes: 0 });
            dump_allowed = false;
            next_offset = None;
            continue;
        }

        let Some(header) = parse_mqd_queue_header(line) else {
            return Err(DebugfsError::unexpected(
                line_no,
                raw,
                "`Process %d PASID %x:`, a queue header (`Compute queue on device %x`, `SDMA queue on device %x`, \
                 `DIQ on device %x`, `Bad user queue type %d on device %x`) or an MQD dump row `%08x: %08x …`",
            ));
        };
        let Some(process) = processes.last_mut() else {
            return Err(DebugfsError::unexpected(line_no, raw, "a `Process %d PASID %x:` line before queue headers"));
        };
        next_offset = None;
        match header {
            MqdHeader::Queue(kind, gpu_id) => {
                process.queues.push(MqdQueue { kind, gpu_id, dumps: 0 });
                // `Bad … queue type` headers are followed by `continue` in pqm_debugfs_mqds: no MQD is dumped.
                dump_allowed = matches!(kind, MqdQueueKind::Compute | MqdQueueKind::Sdma | MqdQueueKind::Diq);
            }
            MqdHeader::Queueless => {
                process.queueless_nodes = process.queueless_nodes.saturating_add(1);
                dump_allowed = false;
            }
        }
    }
    Ok(processes)
}

enum MqdHeader {
    Queue(MqdQueueKind, GpuId),
    Queueless,
}

fn parse_mqd_queue_header(line: &str) -> Option<MqdHeader> {
    if let Some([gpu_id]) = match_line(line, "Compute queue on device {x}") {
        return Some(MqdHeader::Queue(MqdQueueKind::Compute, GpuId(gpu_id)));
    }
    if let Some([gpu_id]) = match_line(line, "SDMA queue on device {x}") {
        return Some(MqdHeader::Queue(MqdQueueKind::Sdma, GpuId(gpu_id)));
    }
    if let Some([gpu_id]) = match_line(line, "DIQ on device {x}") {
        return Some(MqdHeader::Queue(MqdQueueKind::Diq, GpuId(gpu_id)));
    }
    if let Some([ty, gpu_id]) = match_line(line, "Bad user queue type {d} on device {x}") {
        return Some(MqdHeader::Queue(MqdQueueKind::Bad(ty), GpuId(gpu_id)));
    }
    // Spelling (sic) proposed on amd-gfx in 2025 when kernel queues were dropped from the pqm; merge unverified.
    if let Some([ty, gpu_id]) = match_line(line, "Qeueu node with bad user queue type {d} on device {x}") {
        return Some(MqdHeader::Queue(MqdQueueKind::Bad(ty), GpuId(gpu_id)));
    }
    if let Some([ty, gpu_id]) = match_line(line, "Bad kernel queue type {d} on device {x}") {
        return Some(MqdHeader::Queue(MqdQueueKind::BadKernel(ty), GpuId(gpu_id)));
    }
    if match_line::<0>(line, "Weird: Queue node with neither kernel nor user queue").is_some() {
        return Some(MqdHeader::Queueless);
    }
    None
}

// ---------------------------------------------------------------------------------------------------------------
// hqds
// ---------------------------------------------------------------------------------------------------------------

/// One `Node %u, gpu_id %x:` block of `hqds` (`kfd_debugfs_hqds_by_device` + `dqm_debugfs_hqds`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HqdNode {
    /// KFD topology node index; CPU nodes are skipped but still counted, so GPUs usually start at 1 or 2.
    pub node: u32,
    /// KFD gpu_id (printed in hex).
    pub gpu_id: GpuId,
    /// ` Device is stopped`: the scheduler is not running and no slot is dumped.
    pub stopped: bool,
    /// Slots in print order: per XCC the HIQ then the KFD-owned CP slots, then all SDMA RLC queues.
    pub slots: Vec<HqdSlot>,
}

/// One hardware queue slot of `hqds` and its register dump.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HqdSlot {
    /// XCC instance (`Inst %d,` prefix, 6.12+/dkms); None on kernels without multi-XCC support. It is the physical
    /// instance bit of the node's xcc_mask, so a partition need not start at 0.
    pub inst: Option<u32>,
    pub kind: HqdSlotKind,
    /// (register byte address, value), in dump order.
    pub registers: Vec<(u32, u32)>,
    /// CP/HIQ: bit 0 of CP_HQD_ACTIVE; None when the dump is too short to hold it and always None for SDMA, whose
    /// dump carries no single active flag we rely on.
    pub active: Option<bool>,
}

/// The slot header forms of `dqm_debugfs_hqds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum HqdSlotKind {
    /// `HIQ on MEC %d Pipe %d Queue %d` (MEC is 1-based in the text).
    Hiq { mec: u32, pipe: u32, queue: u32 },
    /// `CP Pipe %d, Queue %d`: a compute HQD slot owned by KFD (cp_queue_bitmap).
    Cp { pipe: u32, queue: u32 },
    /// `SDMA Engine %d, RLC %d`.
    Sdma { engine: u32, rlc: u32 },
}

impl HqdNode {
    /// Number of distinct XCC instances among the HIQ/CP slots (a slot without `Inst` counts as one instance); 0 when
    /// no such slot was dumped (stopped device).
    pub fn xcc_count(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| !matches!(s.kind, HqdSlotKind::Sdma { .. }))
            .map(|s| s.inst)
            .collect::<BTreeSet<_>>()
            .len()
    }

    /// CP slots whose CP_HQD_ACTIVE bit is set, over all XCCs.
    pub fn active_compute_slots(&self) -> usize {
        self.slots.iter().filter(|s| matches!(s.kind, HqdSlotKind::Cp { .. }) && s.active == Some(true)).count()
    }

    /// HIQ slots whose CP_HQD_ACTIVE bit is set, over all XCCs.
    pub fn active_hiqs(&self) -> usize {
        self.slots.iter().filter(|s| matches!(s.kind, HqdSlotKind::Hiq { .. }) && s.active == Some(true)).count()
    }
}

/// Parses the text of `/sys/kernel/debug/kfd/hqds`.
pub fn parse_hqds(text: &str) -> Result<Vec<HqdNode>, DebugfsError> {
    let mut nodes: Vec<HqdNode> = Vec::new();

    for (index, raw) in text.lines().enumerate() {
        let line_no = index.saturating_add(1);
        let line = raw.trim();
        if line.is_empty() {
            // seq_reg_dump with n_regs == 0 prints a bare "\n" after the slot header.
            continue;
        }

        if let Some(row) = parse_dump_line(line).map_err(|what| DebugfsError::unexpected(line_no, raw, what))? {
            let Some(slot) = nodes.last_mut().and_then(|n| n.slots.last_mut()) else {
                return Err(DebugfsError::unexpected(
                    line_no,
                    raw,
                    "a slot header (`HIQ on MEC …`, `CP Pipe …`, `SDMA Engine …`) before register rows",
                ));
            };
            if slot.registers.is_empty() && !matches!(slot.kind, HqdSlotKind::Sdma { .. }) {
                // The gfx9 hqd_dump walks mmCP_MQD_BASE_ADDR, mmCP_MQD_BASE_ADDR_HI, mmCP_HQD_ACTIVE, … upward, so
                // CP_HQD_ACTIVE is the 3rd value of the slot's first row (seq_reg_dump keeps consecutive registers on
                // one row). This "3rd value of the first line" rule is the one documented in
                // fixtures/debugfs-mi308x/README.md; docs/kfd.md §4.2 leaves the exact order unverified.
                slot.active = row.words().get(2).map(|value| value & 1 == 1);
            }
            for (i, &value) in row.words().iter().enumerate() {
                // seq_reg_dump: the i-th value of a row belongs to the register 4*i bytes after the row address.
                let address =
                    u32::try_from(i).ok().and_then(|i| i.checked_mul(4)).and_then(|d| row.offset.checked_add(d));
                let Some(address) = address else {
                    return Err(DebugfsError::bad_dump(
                        line_no,
                        raw,
                        "register addresses that stay below 2^32 (row address + 4 per value)".to_owned(),
                    ));
                };
                slot.registers.push((address, value));
            }
            continue;
        }

        if let Some([node, gpu_id]) = match_line(line, "Node {d}, gpu_id {x}:") {
            nodes.push(HqdNode { node, gpu_id: GpuId(gpu_id), stopped: false, slots: Vec::new() });
            continue;
        }

        if match_line::<0>(line, "Device is stopped").is_some() {
            let Some(node) = nodes.last_mut() else {
                return Err(DebugfsError::unexpected(
                    line_no,
                    raw,
                    "a `Node %u, gpu_id %x:` line before ` Device is stopped`",
                ));
            };
            if node.stopped || !node.slots.is_empty() {
                return Err(DebugfsError::unexpected(
                    line_no,
                    raw,
                    "` Device is stopped` only as the sole line of a node (dqm_debugfs_hqds returns after it)",
                ));
            }
            node.stopped = true;
            continue;
        }

        let Some((inst, kind)) = parse_hqd_slot_header(line) else {
            return Err(DebugfsError::unexpected(
                line_no,
                raw,
                "`Node %u, gpu_id %x:`, a slot header (`[Inst %d,] HIQ on MEC %d Pipe %d Queue %d`, \
                 `[Inst %d,] CP Pipe %d, Queue %d`, `SDMA Engine %d, RLC %d`), ` Device is stopped` or a register row \
                 `%08x: %08x …`",
            ));
        };
        let Some(node) = nodes.last_mut() else {
            return Err(DebugfsError::unexpected(line_no, raw, "a `Node %u, gpu_id %x:` line before slot headers"));
        };
        if node.stopped {
            return Err(DebugfsError::unexpected(
                line_no,
                raw,
                "a `Node %u, gpu_id %x:` line after ` Device is stopped` (dqm_debugfs_hqds dumps no slot then)",
            ));
        }
        node.slots.push(HqdSlot { inst, kind, registers: Vec::new(), active: None });
    }
    Ok(nodes)
}

fn parse_hqd_slot_header(line: &str) -> Option<(Option<u32>, HqdSlotKind)> {
    let mut tokens = line.split_whitespace();
    // 6.12+/dkms prefix HIQ and CP headers with the XCC instance (`   Inst %d, HIQ …`, ` Inst %d,  CP …`); 6.1 does
    // not, and SDMA headers never have it, but any header is accepted with or without it.
    let inst = {
        let mut probe = tokens.clone();
        match_tokens(&mut probe, "Inst {d},").map(|[inst]| {
            tokens = probe;
            inst
        })
    };
    let kind = if let Some([mec, pipe, queue]) = match_rest(&tokens, "HIQ on MEC {d} Pipe {d} Queue {d}") {
        HqdSlotKind::Hiq { mec, pipe, queue }
    } else if let Some([pipe, queue]) = match_rest(&tokens, "CP Pipe {d}, Queue {d}") {
        HqdSlotKind::Cp { pipe, queue }
    } else if let Some([engine, rlc]) = match_rest(&tokens, "SDMA Engine {d}, RLC {d}") {
        HqdSlotKind::Sdma { engine, rlc }
    } else {
        return None;
    };
    Some((inst, kind))
}

// ---------------------------------------------------------------------------------------------------------------
// rls
// ---------------------------------------------------------------------------------------------------------------

/// One `Node %u, gpu_id %x:` block of `rls` (`kfd_debugfs_rls_by_device` + `pm_debugfs_runlist`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunlistNode {
    /// KFD topology node index (CPU nodes are counted but not printed).
    pub node: u32,
    /// KFD gpu_id (printed in hex).
    pub gpu_id: GpuId,
    /// None for `  No active runlist`; otherwise the dwords of the runlist IB (PM4 packets). An allocated IB of size
    /// 0 prints nothing at all, which reads as `Some(vec![])`.
    pub runlist: Option<Vec<u32>>,
}

/// Parses the text of `/sys/kernel/debug/kfd/rls`.
pub fn parse_rls(text: &str) -> Result<Vec<RunlistNode>, DebugfsError> {
    let mut nodes: Vec<RunlistNode> = Vec::new();
    // Offset the next IB dump row must have; None before the first row of the node.
    let mut next_offset: Option<u32> = None;

    for (index, raw) in text.lines().enumerate() {
        let line_no = index.saturating_add(1);
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }

        if let Some(row) = parse_dump_line(line).map_err(|what| DebugfsError::unexpected(line_no, raw, what))? {
            let Some(node) = nodes.last_mut() else {
                return Err(DebugfsError::unexpected(line_no, raw, "a `Node %u, gpu_id %x:` line before runlist rows"));
            };
            let Some(words) = node.runlist.as_mut() else {
                return Err(DebugfsError::unexpected(
                    line_no,
                    raw,
                    "a `Node %u, gpu_id %x:` line after `No active runlist` (pm_debugfs_runlist prints it or the IB)",
                ));
            };
            // One IB per node, dumped from offset 0 in contiguous rows.
            let expected = if words.is_empty() { Some(0) } else { next_offset };
            if expected != Some(row.offset) {
                return Err(DebugfsError::bad_dump(line_no, raw, continuation_expectation(expected)));
            }
            words.extend_from_slice(row.words());
            next_offset = row.offset.checked_add(row.byte_len());
            continue;
        }

        if let Some([node, gpu_id]) = match_line(line, "Node {d}, gpu_id {x}:") {
            nodes.push(RunlistNode { node, gpu_id: GpuId(gpu_id), runlist: Some(Vec::new()) });
            next_offset = None;
            continue;
        }

        if match_line::<0>(line, "No active runlist").is_some() {
            let Some(node) = nodes.last_mut() else {
                return Err(DebugfsError::unexpected(
                    line_no,
                    raw,
                    "a `Node %u, gpu_id %x:` line before `No active runlist`",
                ));
            };
            if node.runlist.as_ref().is_none_or(|words| !words.is_empty()) {
                return Err(DebugfsError::unexpected(
                    line_no,
                    raw,
                    "`No active runlist` only as the only line of a node (pm_debugfs_runlist prints it or the IB)",
                ));
            }
            node.runlist = None;
            continue;
        }

        return Err(DebugfsError::unexpected(
            line_no,
            raw,
            "`Node %u, gpu_id %x:`, `  No active runlist` or a runlist dump row `%08x: %08x …`",
        ));
    }
    Ok(nodes)
}

// ---------------------------------------------------------------------------------------------------------------
// Shared line grammar
// ---------------------------------------------------------------------------------------------------------------

/// A `%08x: %08x %08x …` row: `seq_hex_dump(…, DUMP_PREFIX_OFFSET, 32, 4, …)` in mqds/rls (offset = byte offset in
/// the buffer) or `seq_reg_dump` in hqds (offset = byte address of the first register).
struct DumpRow {
    offset: u32,
    words: [u32; MAX_WORDS_PER_LINE],
    len: usize,
}

impl DumpRow {
    fn words(&self) -> &[u32] {
        self.words.get(..self.len).unwrap_or(&[])
    }

    /// Bytes the row covers; at most 32, so the conversion cannot fail in practice.
    fn byte_len(&self) -> u32 {
        u32::try_from(self.len).unwrap_or(0).saturating_mul(4)
    }
}

/// Ok(None) when the line is not a dump row at all (its first token is not `xxxxxxxx:`), Err with the expectation
/// when it starts like one but the rest is malformed.
fn parse_dump_line(line: &str) -> Result<Option<DumpRow>, &'static str> {
    let mut tokens = line.split_whitespace();
    let Some(offset) = tokens.next().and_then(|t| t.strip_suffix(':')).and_then(parse_hex8) else {
        return Ok(None);
    };
    let mut row = DumpRow { offset, words: [0; MAX_WORDS_PER_LINE], len: 0 };
    for token in tokens {
        let Some(word) = parse_hex8(token) else {
            // groupsize 4 prints every value as exactly 8 hex digits (`%08x` in seq_reg_dump).
            return Err("8-digit hex words after the `%08x:` offset of a dump row");
        };
        let Some(slot) = row.words.get_mut(row.len) else {
            return Err("at most 8 words per dump row (32-byte rows / seq_reg_dump groups of 8)");
        };
        *slot = word;
        row.len = row.len.saturating_add(1);
    }
    if row.len == 0 {
        return Err("at least one word after the `%08x:` offset of a dump row");
    }
    Ok(Some(row))
}

fn continuation_expectation(next_offset: Option<u32>) -> String {
    match next_offset {
        Some(next) => format!("offset {next:08x} (dump rows are contiguous) or 00000000 (start of a new dump)"),
        None => "offset 00000000 (a dump starts at offset 0)".to_owned(),
    }
}

/// Exactly 8 hex digits, as `%08x` prints any u32 (`from_str_radix` alone would also take a leading `+`).
fn parse_hex8(s: &str) -> Option<u32> {
    if s.len() == 8 && s.bytes().all(|b| b.is_ascii_hexdigit()) { u32::from_str_radix(s, 16).ok() } else { None }
}

/// `%x`: 1–8 hex digits, no `0x`.
fn parse_hex(s: &str) -> Option<u32> {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit()) { u32::from_str_radix(s, 16).ok() } else { None }
}

/// `%d`/`%u` of a non-negative value: ASCII digits only, must fit u32.
fn parse_dec(s: &str) -> Option<u32> {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) { s.parse().ok() } else { None }
}

/// The PASID field: `0x%x` on 6.1/6.12, `%d` on newer kernels (docs/kfd.md §4.2).
fn parse_pasid(s: &str) -> Option<u32> {
    match s.strip_prefix("0x") {
        Some(hex) => parse_hex(hex),
        None => parse_dec(s),
    }
}

/// Matches `line` token by token (whitespace-insensitive) against `pattern`, whose tokens are literals or contain
/// one placeholder with optional literal prefix/suffix: `{d}` decimal, `{x}` hex, `{p}` PASID. The whole line must be
/// consumed and the pattern must hold exactly N placeholders.
fn match_line<const N: usize>(line: &str, pattern: &str) -> Option<[u32; N]> {
    match_rest(&line.split_whitespace(), pattern)
}

/// Like [`match_line`] on the remaining tokens, without consuming them.
fn match_rest<const N: usize>(tokens: &SplitWhitespace<'_>, pattern: &str) -> Option<[u32; N]> {
    let mut tokens = tokens.clone();
    let fields = match_tokens(&mut tokens, pattern)?;
    if tokens.next().is_some() { None } else { Some(fields) }
}

/// Matches the pattern against the next tokens, leaving the rest in `tokens`.
fn match_tokens<const N: usize>(tokens: &mut SplitWhitespace<'_>, pattern: &str) -> Option<[u32; N]> {
    let mut fields = [0u32; N];
    let mut count = 0usize;
    for pat in pattern.split_whitespace() {
        let token = tokens.next()?;
        let Some((prefix, rest)) = pat.split_once('{') else {
            if token != pat {
                return None;
            }
            continue;
        };
        let (spec, suffix) = rest.split_once('}')?;
        let body = token.strip_prefix(prefix)?.strip_suffix(suffix)?;
        let value = match spec {
            "d" => parse_dec(body),
            "x" => parse_hex(body),
            "p" => parse_pasid(body),
            _ => None,
        }?;
        *fields.get_mut(count)? = value;
        count = count.saturating_add(1);
    }
    if count == N { Some(fields) } else { None }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let path = format!("{}/../fixtures/debugfs-mi308x/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading fixture {path}: {e}"))
    }

    fn err_line<T: std::fmt::Debug>(result: Result<T, DebugfsError>) -> usize {
        result.expect_err("input must be rejected").line()
    }

    // ---- fixtures ----

    #[test]
    fn mqds_fixture_counts_queues_by_header_not_by_dump() {
        let processes = parse_mqds(&fixture("mqds_active.txt")).unwrap();
        assert_eq!(processes.len(), 1);
        let p = &processes[0];
        assert_eq!(p.pid, HostPid(94314));
        assert_eq!(p.second_field, 94314);
        assert_eq!(p.queueless_nodes, 0);
        assert_eq!(p.queues.len(), 5);
        for q in &p.queues {
            assert_eq!(q, &MqdQueue { kind: MqdQueueKind::Compute, gpu_id: GpuId(0xf7bc), dumps: 4 });
        }
        assert_eq!(p.queues.iter().map(|q| q.dumps).sum::<usize>(), 20);
    }

    #[test]
    fn hqds_active_fixture() {
        let nodes = parse_hqds(&fixture("hqds_active.txt")).unwrap();
        assert_eq!(nodes.len(), 8);
        assert_eq!(nodes.iter().map(|n| n.node).collect::<Vec<_>>(), (2..=9).collect::<Vec<_>>());
        assert_eq!(
            nodes.iter().map(|n| n.gpu_id).collect::<Vec<_>>(),
            [0xf7bc, 0xf05b, 0xeb40, 0xc66d, 0xf220, 0xf5c7, 0xeedc, 0xc3f1].map(GpuId)
        );
        for n in &nodes {
            assert!(!n.stopped);
            assert_eq!(n.xcc_count(), 4, "node {}", n.node);
            assert_eq!(n.active_hiqs(), 4, "node {}", n.node);
            // Every CP/HIQ slot has a 56-register dump, so the active flag is always known; SDMA never.
            for s in &n.slots {
                match s.kind {
                    HqdSlotKind::Sdma { .. } => assert_eq!(s.active, None),
                    _ => {
                        assert!(s.active.is_some());
                        assert_eq!(s.registers.len(), 56);
                    }
                }
            }
        }
        assert_eq!(nodes.iter().map(HqdNode::active_hiqs).sum::<usize>(), 32);
        assert_eq!(nodes.iter().map(HqdNode::active_compute_slots).sum::<usize>(), 20);
        assert_eq!(nodes[0].active_compute_slots(), 20);
        assert!(nodes[1..].iter().all(|n| n.active_compute_slots() == 0));

        let active: BTreeSet<(Option<u32>, u32, u32)> = nodes[0]
            .slots
            .iter()
            .filter(|s| s.active == Some(true))
            .filter_map(|s| match s.kind {
                HqdSlotKind::Cp { pipe, queue } => Some((s.inst, pipe, queue)),
                _ => None,
            })
            .collect();
        let expected: BTreeSet<(Option<u32>, u32, u32)> =
            (0..4).flat_map(|inst| [(0, 2), (0, 3), (1, 2), (2, 2), (3, 2)].map(|(p, q)| (Some(inst), p, q))).collect();
        assert_eq!(active, expected);

        // First slot of the file: `   Inst 0, HIQ on MEC 2 Pipe 0 Queue 0` / `0000c914: 006e3000 00000000 00000001 …`.
        let hiq = &nodes[0].slots[0];
        assert_eq!(hiq.inst, Some(0));
        assert_eq!(hiq.kind, HqdSlotKind::Hiq { mec: 2, pipe: 0, queue: 0 });
        assert_eq!(hiq.registers[..3], [(0xc914, 0x006e3000), (0xc918, 0), (0xc91c, 1)]);
        assert_eq!(hiq.active, Some(true));
    }

    #[test]
    fn hqds_register_rows_restart_at_address_gaps() {
        let nodes = parse_hqds(&fixture("hqds_active.txt")).unwrap();
        // `  SDMA Engine 0, RLC 0`: rows 00004e80 (3 values), 00004ee0 (6), 00004efc (7): 0x4ef8 is skipped.
        let sdma = nodes[0].slots.iter().find(|s| s.kind == HqdSlotKind::Sdma { engine: 0, rlc: 0 }).unwrap();
        let addrs: Vec<u32> = sdma.registers.iter().map(|r| r.0).collect();
        assert!(addrs.contains(&0x4e88) && !addrs.contains(&0x4e8c));
        assert!(addrs.contains(&0x4ef4) && !addrs.contains(&0x4ef8) && addrs.contains(&0x4efc));
        assert!(addrs.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn hqds_after_exit_and_baseline_fixtures() {
        for name in ["hqds_after_exit.txt", "hqds_baseline.txt"] {
            let nodes = parse_hqds(&fixture(name)).unwrap();
            assert_eq!(nodes.len(), 8, "{name}");
            assert_eq!(nodes.iter().map(|n| n.node).collect::<Vec<_>>(), (2..=9).collect::<Vec<_>>(), "{name}");
            assert_eq!(nodes[0].gpu_id, GpuId(0xf7bc), "{name}");
            assert!(nodes.iter().all(|n| n.xcc_count() == 4), "{name}");
            assert_eq!(nodes.iter().map(HqdNode::active_compute_slots).sum::<usize>(), 0, "{name}");
            assert_eq!(nodes.iter().map(HqdNode::active_hiqs).sum::<usize>(), 32, "{name}");
        }
    }

    // ---- synthetic 6.1 / newer forms ----

    #[test]
    fn mqds_6_1_forms() {
        let text = "Process 1234 PASID 0x8001:\n\
                    \x20 SDMA queue on device 1002\n\
                    \x20   00000000: 00000001 00000002 00000003 00000004 00000005 00000006 00000007 00000008\n\
                    \x20   00000020: 00000009 0000000a\n\
                    \x20 Compute queue on device 1002\n\
                    \x20   00000000: 00000000\n\
                    \x20 DIQ on device 1002\n\
                    \x20   00000000: 00000000\n\
                    \x20 Bad user queue type 7 on device 1002\n\
                    \x20 Bad kernel queue type 9 on device 1002\n\
                    \x20 Weird: Queue node with neither kernel nor user queue\n\
                    \n\
                    Process 99 PASID 0x0:\n";
        let processes = parse_mqds(text).unwrap();
        assert_eq!(
            processes,
            vec![
                MqdProcess {
                    pid: HostPid(1234),
                    second_field: 0x8001,
                    queues: vec![
                        MqdQueue { kind: MqdQueueKind::Sdma, gpu_id: GpuId(0x1002), dumps: 1 },
                        MqdQueue { kind: MqdQueueKind::Compute, gpu_id: GpuId(0x1002), dumps: 1 },
                        MqdQueue { kind: MqdQueueKind::Diq, gpu_id: GpuId(0x1002), dumps: 1 },
                        MqdQueue { kind: MqdQueueKind::Bad(7), gpu_id: GpuId(0x1002), dumps: 0 },
                        MqdQueue { kind: MqdQueueKind::BadKernel(9), gpu_id: GpuId(0x1002), dumps: 0 },
                    ],
                    queueless_nodes: 1,
                },
                MqdProcess { pid: HostPid(99), second_field: 0, queues: vec![], queueless_nodes: 0 },
            ]
        );
        assert_eq!(parse_mqds("").unwrap(), vec![]);
        // Newer kernels print the second field in decimal.
        assert_eq!(parse_mqds("Process 5 PASID 17:").unwrap()[0].second_field, 17);
    }

    #[test]
    fn hqds_6_1_forms() {
        let text = "Node 1, gpu_id 1002:\n\
                    \x20 HIQ on MEC 2 Pipe 0 Queue 0\n\
                    \x20   00003245: 00001000 00000000 00000001\n\
                    \x20 CP Pipe 0, Queue 1\n\
                    \x20   00003245: 00002000 00000000 00000000 00000005\n\
                    \x20   00003300: 0000abcd\n\
                    \x20 CP Pipe 1, Queue 0\n\
                    \x20   00003245: 00002000 00000000\n\
                    \x20 SDMA Engine 0, RLC 1\n\
                    \x20   00004e40: 00000001\n\
                    Node 2, gpu_id 2003:\n\
                    \x20Device is stopped\n";
        let nodes = parse_hqds(text).unwrap();
        assert_eq!(nodes.len(), 2);
        let n = &nodes[0];
        assert_eq!((n.node, n.gpu_id, n.stopped), (1, GpuId(0x1002), false));
        assert_eq!(
            n.slots,
            vec![
                HqdSlot {
                    inst: None,
                    kind: HqdSlotKind::Hiq { mec: 2, pipe: 0, queue: 0 },
                    registers: vec![(0x3245, 0x1000), (0x3249, 0), (0x324d, 1)],
                    active: Some(true),
                },
                HqdSlot {
                    inst: None,
                    kind: HqdSlotKind::Cp { pipe: 0, queue: 1 },
                    registers: vec![(0x3245, 0x2000), (0x3249, 0), (0x324d, 0), (0x3251, 5), (0x3300, 0xabcd)],
                    active: Some(false),
                },
                HqdSlot {
                    inst: None,
                    kind: HqdSlotKind::Cp { pipe: 1, queue: 0 },
                    registers: vec![(0x3245, 0x2000), (0x3249, 0)],
                    active: None,
                },
                HqdSlot {
                    inst: None,
                    kind: HqdSlotKind::Sdma { engine: 0, rlc: 1 },
                    registers: vec![(0x4e40, 1)],
                    active: None,
                },
            ]
        );
        assert_eq!((n.xcc_count(), n.active_hiqs(), n.active_compute_slots()), (1, 1, 0));
        assert_eq!(nodes[1], HqdNode { node: 2, gpu_id: GpuId(0x2003), stopped: true, slots: vec![] });
        assert_eq!(nodes[1].xcc_count(), 0);
    }

    #[test]
    fn hqds_inst_prefix_is_optional_and_whitespace_free() {
        let text = "Node 3, gpu_id ab:\n   Inst 2, HIQ on MEC 2 Pipe 0 Queue 0\n\tInst 3,  CP   Pipe 0,\tQueue 2  \n\
                    Inst 3, SDMA Engine 1, RLC 0\n";
        let slots = &parse_hqds(text).unwrap()[0].slots;
        assert_eq!(
            slots.iter().map(|s| (s.inst, s.kind)).collect::<Vec<_>>(),
            [
                (Some(2), HqdSlotKind::Hiq { mec: 2, pipe: 0, queue: 0 }),
                (Some(3), HqdSlotKind::Cp { pipe: 0, queue: 2 }),
                (Some(3), HqdSlotKind::Sdma { engine: 1, rlc: 0 }),
            ]
        );
    }

    #[test]
    fn rls_forms() {
        let text = "Node 1, gpu_id 1002:\n  No active runlist\nNode 2, gpu_id 2003:\n\
                    \x20 00000000: a0001000 00000001 00000002 00000003 00000004 00000005 00000006 00000007\n\
                    \x20 00000020: 00000008 00000009\n\
                    Node 3, gpu_id 3004:\n";
        assert_eq!(
            parse_rls(text).unwrap(),
            vec![
                RunlistNode { node: 1, gpu_id: GpuId(0x1002), runlist: None },
                RunlistNode {
                    node: 2,
                    gpu_id: GpuId(0x2003),
                    runlist: Some(vec![0xa0001000, 1, 2, 3, 4, 5, 6, 7, 8, 9])
                },
                RunlistNode { node: 3, gpu_id: GpuId(0x3004), runlist: Some(vec![]) },
            ]
        );
        assert_eq!(parse_rls("\n\n").unwrap(), vec![]);
    }

    #[test]
    fn serializes_to_json() {
        let nodes = parse_rls("Node 1, gpu_id 1002:\n  No active runlist\n").unwrap();
        assert_eq!(serde_json::to_string(&nodes).unwrap(), r#"[{"node":1,"gpu_id":4098,"runlist":null}]"#);
        let slot = HqdSlot { inst: None, kind: HqdSlotKind::Cp { pipe: 1, queue: 2 }, registers: vec![], active: None };
        assert_eq!(
            serde_json::to_string(&slot).unwrap(),
            r#"{"inst":null,"kind":{"Cp":{"pipe":1,"queue":2}},"registers":[],"active":null}"#
        );
        let err = parse_rls("bogus").unwrap_err();
        assert!(serde_json::to_string(&err).unwrap().contains(r#""line":1"#));
    }

    // ---- errors name the right line ----

    #[test]
    fn mqds_errors_name_the_line() {
        // Queue header before any Process line (line 2: blank lines still count).
        assert_eq!(err_line(parse_mqds("\n  Compute queue on device f7bc\n")), 2);
        // Dump row right after a Process line.
        assert_eq!(err_line(parse_mqds("Process 1 PASID 0x1:\n    00000000: 00000000\n")), 2);
        // Dump row after a `Bad user queue type` header, which the kernel never dumps.
        assert_eq!(
            err_line(parse_mqds("Process 1 PASID 0x1:\n  Bad user queue type 3 on device 1\n    00000000: 00000000\n")),
            3
        );
        // Non-contiguous row inside a dump.
        let gap = "Process 1 PASID 0x1:\n  Compute queue on device 1\n    00000000: 00000000 00000000\n\
                   \x20   00000010: 00000000\n";
        let err = parse_mqds(gap).unwrap_err();
        assert_eq!(err.line(), 4);
        assert!(matches!(err, DebugfsError::BadDump { .. }), "{err}");
        assert!(err.to_string().contains("00000008"), "{err}");
        // A dump must start at offset 0.
        assert_eq!(err_line(parse_mqds("Process 1 PASID 0x1:\n  SDMA queue on device 1\n    00000020: 00000000\n")), 3);
        // Unknown line, overflowing pid, malformed words, too many words.
        assert_eq!(err_line(parse_mqds("Process 1 PASID 0x1:\n\n  Graphics queue on device 1\n")), 3);
        assert_eq!(err_line(parse_mqds("Process 4294967296 PASID 0x1:\n")), 1);
        assert_eq!(err_line(parse_mqds("Process -1 PASID 0x1:\n")), 1);
        assert_eq!(err_line(parse_mqds("Process 1 PASID 0x:\n")), 1);
        assert_eq!(
            err_line(parse_mqds("Process 1 PASID 0x1:\n  Compute queue on device 1\n    00000000: 0000000g\n")),
            3
        );
        let nine =
            format!("Process 1 PASID 0x1:\n  Compute queue on device 1\n    00000000:{}\n", " 00000000".repeat(9));
        assert_eq!(err_line(parse_mqds(&nine)), 3);
        assert_eq!(err_line(parse_mqds("Process 1 PASID 0x1:\n  Compute queue on device 1\n    00000000:\n")), 3);
    }

    #[test]
    fn hqds_errors_name_the_line() {
        // Register row before any slot header (directly after the Node line).
        let err = parse_hqds("Node 0, gpu_id 1:\n    00001000: 00000001\n").unwrap_err();
        assert_eq!(err.line(), 2);
        assert_eq!(err.text(), "    00001000: 00000001");
        // Register row before any Node line.
        assert_eq!(err_line(parse_hqds("\n\n    00001000: 00000001\n")), 3);
        // Slot header before any Node line.
        assert_eq!(err_line(parse_hqds("  CP Pipe 0, Queue 0\n")), 1);
        // Slot after ` Device is stopped`, stopped after slots, stopped twice.
        assert_eq!(err_line(parse_hqds("Node 1, gpu_id 1:\n Device is stopped\n  CP Pipe 0, Queue 0\n")), 3);
        assert_eq!(err_line(parse_hqds("Node 1, gpu_id 1:\n  CP Pipe 0, Queue 0\n Device is stopped\n")), 3);
        assert_eq!(err_line(parse_hqds("Node 1, gpu_id 1:\n Device is stopped\n Device is stopped\n")), 3);
        // Register addresses past 2^32.
        let overflow = "Node 1, gpu_id 1:\n  SDMA Engine 0, RLC 0\n    fffffffc: 00000000 00000000\n";
        let err = parse_hqds(overflow).unwrap_err();
        assert!(matches!(err, DebugfsError::BadDump { line: 3, .. }), "{err}");
        // Unknown header, bad Inst prefix, gpu_id too wide.
        assert_eq!(err_line(parse_hqds("Node 1, gpu_id 1:\n  KIQ on MEC 1 Pipe 0 Queue 0\n")), 2);
        assert_eq!(err_line(parse_hqds("Node 1, gpu_id 1:\n Inst x,  CP Pipe 0, Queue 0\n")), 2);
        assert_eq!(err_line(parse_hqds("Node 1, gpu_id 123456789:\n")), 1);
    }

    #[test]
    fn rls_errors_name_the_line() {
        assert_eq!(err_line(parse_rls("  00000000: 00000000\n")), 1);
        assert_eq!(err_line(parse_rls("  No active runlist\n")), 1);
        assert_eq!(err_line(parse_rls("Node 1, gpu_id 1:\n  No active runlist\n  00000000: 00000000\n")), 3);
        assert_eq!(err_line(parse_rls("Node 1, gpu_id 1:\n  00000000: 00000000\n  No active runlist\n")), 3);
        assert_eq!(err_line(parse_rls("Node 1, gpu_id 1:\n  No active runlist\n  No active runlist\n")), 3);
        assert_eq!(err_line(parse_rls("Node 1, gpu_id 1:\n  00000020: 00000000\n")), 2);
        assert_eq!(err_line(parse_rls("Node 1, gpu_id 1:\n  00000000: 00000000\n  00000000: 00000000\n")), 3);
        assert_eq!(err_line(parse_rls("Node 1, gpu_id 1:\n\n\n  Runlist busy\n")), 4);
    }

    // ---- robustness ----

    fn parse_all(text: &str) {
        let _ = parse_mqds(text);
        let _ = parse_hqds(text);
        let _ = parse_rls(text);
    }

    /// Deterministic xorshift64 so failures reproduce.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    #[test]
    fn truncated_and_garbage_inputs_never_panic() {
        let mqds = fixture("mqds_active.txt");
        let hqds = fixture("hqds_active.txt");
        // Every byte prefix of excerpts that cover all header and row forms of the fixtures (the full files would
        // be quadratic): the mqds head, and an hqds excerpt with the Node line, HIQ and CP slots and an SDMA slot.
        let sdma_at = hqds.find("  SDMA Engine 0, RLC 0").unwrap();
        let hqds_excerpt = format!("{}{}", &hqds[..3000], &hqds[sdma_at..sdma_at + 1500]);
        for excerpt in [&mqds[..4000], hqds_excerpt.as_str()] {
            for end in 0..=excerpt.len() {
                parse_all(&excerpt[..end]);
            }
        }
        // Line-boundary prefixes of the whole files: every 4th line of mqds, every 211th of hqds.
        for (end, _) in mqds.match_indices('\n').step_by(4) {
            parse_all(&mqds[..end]);
        }
        for (end, _) in hqds.match_indices('\n').step_by(211) {
            parse_all(&hqds[..end]);
        }

        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        // Random bytes biased towards the alphabet of these files.
        let alphabet = b"0123456789abcdefx:, \n\tNodegpu_idInstHIQCPSDMAPipeQueueMECRLCProcessPASIDDevice\xff\xfe";
        for _ in 0..2000 {
            let len = rng.below(300);
            let bytes: Vec<u8> = (0..len).map(|_| alphabet[rng.below(alphabet.len())]).collect();
            parse_all(&String::from_utf8_lossy(&bytes));
        }
        // Mutations of a fixture excerpt: byte flips, deletions and digit insertions (overflowing numbers).
        let base = hqds_excerpt.as_bytes();
        for _ in 0..500 {
            let mut bytes = base.to_vec();
            for _ in 0..1 + rng.below(8) {
                let at = rng.below(bytes.len());
                match rng.below(3) {
                    0 => bytes[at] = rng.next() as u8,
                    1 => {
                        bytes.remove(at);
                    }
                    _ => {
                        bytes.splice(at..at, *b"99999999999");
                    }
                }
            }
            parse_all(&String::from_utf8_lossy(&bytes));
        }
        // Hand-picked edge cases.
        let row_at_ffffffe0 = format!("    ffffffe0:{}", " 00000000".repeat(8));
        let edge_cases = [
            "\0".to_owned(),
            "\r\n\r\n".to_owned(),
            ":".to_owned(),
            format!("    ffffffff:{}", " ffffffff".repeat(8)),
            format!("Node 4294967295, gpu_id ffffffff:\n{row_at_ffffffe0}"),
            "Node 1, gpu_id 1:\n  SDMA Engine 0, RLC 0\n    fffffffc: 00000000 00000000".to_owned(),
            format!("Process 1 PASID 0x1:\n  Compute queue on device 1\n{row_at_ffffffe0}\n    00000000: 00000000"),
            format!("Node 1, gpu_id 1:\n  00000000:{}", " 00000000".repeat(8)),
            "Inst 1,".to_owned(),
            "Inst 99999999999, CP Pipe 0, Queue 0".to_owned(),
            "{d} {x} {p}".to_owned(),
            "Process \u{1F600} PASID 0x\u{1F600}:".to_owned(),
        ];
        for text in &edge_cases {
            parse_all(text);
        }
        let long_line = "x".repeat(1 << 20);
        assert!(parse_mqds(&long_line).unwrap_err().text().len() <= MAX_EXCERPT_CHARS);
    }
}
