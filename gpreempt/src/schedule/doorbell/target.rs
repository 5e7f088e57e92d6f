//! Where the doorbell uprobe sits in a runtime library: on the implementation the exported store
//! jumps to, not on the export itself, when the export is ROCr's API-table thunk.
//!
//! ROCr exports `hsa_signal_store_screlease` (and `_relaxed`) as thunks through its API table
//! (`hsa_table_interface.cpp`: `coreApiTable->hsa_signal_store_screlease_fn(signal, value)`), which
//! compile to `mov coreApiTable(%rip),%rax; jmp *0x160(%rax)` (`_relaxed`: `0x158`), with
//! `endbr64` first where the runtime is built with CET (trixie's 6.1). A uprobe on that `mov`
//! (RIP-relative) is executed out of line: a breakpoint trap and then a single-step trap, on every
//! kernel launch. The implementation it jumps to (`rocr::HSA::hsa_signal_store_screlease`) begins
//! `push %rbp; push %rbx; sub $8,%rsp` in both Debian's ROCr 5.2 (`libhsa-runtime64.so.1.5.0`,
//! file offset 0x4d420) and trixie's 6.1 (`.so.1.13.0`, 0x618f0, after its `endbr64`), read from
//! the API table of a process that loaded each; x86 uprobes emulate a `push`
//! (`push_setup_xol_ops`, arch/x86/kernel/uprobes.c, Linux ≥ 4.18): one trap, no single step.
//! Natively on the harness's host that is 0.6 µs per store instead of 9.4 µs (`harness
//! store-cost`, the stand-in runtime with each first instruction; BENCHMARKS §9.3).
//!
//! The table is read from the running process (it is filled when the runtime loads); every
//! caller of the export reaches the implementation, and so do the runtime's own calls of it. When
//! the export is not such a thunk, or the table entry points outside the library (a tool that
//! intercepts the API table, such as a profiler, installed its own function), the probe stays on
//! the export.

use std::{fs, path::Path};

use object::{Object, ObjectSegment, ObjectSymbol};

use super::library::RuntimeLibrary;
use crate::{domain::HostPid, schedule::online::read_u64s};

/// Where one export's uprobe goes, as a file offset in the library.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProbePoint {
    pub symbol: &'static str,
    /// File offset of the probed instruction.
    pub offset: u64,
    /// On the implementation the export's thunk jumps to (else on the export itself).
    pub implementation: bool,
}

/// `endbr64`.
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// The API-table slot an export's code loads and jumps through: `mov disp32(%rip),%rax` then
/// `jmp *off(%rax)` (after an optional `endbr64`). Returns (the address of the table pointer, the
/// entry's offset in the table), for code at `at`.
pub fn thunk_slot(code: &[u8], at: u64) -> Option<(u64, u64)> {
    let skip = if code.starts_with(&ENDBR64) { 4 } else { 0 };
    let c = code.get(skip..)?;
    // 48 8b 05 disp32: mov disp32(%rip),%rax (REX.W, ModRM 00 000 101).
    if c.get(..3)? != [0x48, 0x8b, 0x05] {
        return None;
    }
    let disp = i32::from_le_bytes(c.get(3..7)?.try_into().ok()?);
    let next = at + skip as u64 + 7;
    let table_pointer = next.checked_add_signed(i64::from(disp))?;
    // ff a0 disp32 / ff 60 disp8 / ff 20: jmp *disp(%rax) (ModRM 10/01/00 100 000).
    let offset = match c.get(7..9)? {
        [0xff, 0xa0] => u64::try_from(i32::from_le_bytes(c.get(9..13)?.try_into().ok()?)).ok()?,
        [0xff, 0x60] => u64::try_from(i8::from_le_bytes([*c.get(9)?])).ok()?,
        [0xff, 0x20] => 0,
        _ => return None,
    };
    Some((table_pointer, offset))
}

/// The u64 at `address` of `pid`'s memory.
fn read_u64(pid: HostPid, address: u64) -> Option<u64> {
    let mut word = [0u64];
    read_u64s(pid, &[address], &mut word).ok()?;
    Some(word[0])
}

/// The longest thunk: `endbr64` (4) + `mov` (7) + `jmp` with a 32-bit displacement (6) = 17 bytes.
const THUNK_WORDS: usize = 3;

/// Where to probe `symbol` of `library` (parsed as `elf`) in `pid`: its implementation when the
/// export is a table thunk whose entry lies in the library, else the export (see the module).
fn probe_point(pid: HostPid, library: &RuntimeLibrary, elf: &object::File, symbol: &'static str) -> Option<ProbePoint> {
    let sym = elf.dynamic_symbols().find(|s| s.name() == Ok(symbol))?;
    let export = elf
        .segments()
        .find(|seg| (seg.address()..seg.address() + seg.size()).contains(&sym.address()))
        .map(|seg| sym.address() - seg.address() + seg.file_range().0)?;
    let implementation = || {
        let at = library.address_of(export)?;
        let mut words = [0u64; THUNK_WORDS];
        let addresses: [u64; THUNK_WORDS] = std::array::from_fn(|i| at + 8 * i as u64);
        read_u64s(pid, &addresses, &mut words).ok()?;
        let code: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let (table_pointer, entry) = thunk_slot(&code, at)?;
        let target = read_u64(pid, read_u64(pid, table_pointer)?.checked_add(entry)?)?;
        let offset = library.offset_of(target)?;
        let skip = if read_u64(pid, target)?.to_le_bytes().starts_with(&ENDBR64) { 4 } else { 0 };
        Some(offset + skip)
    };
    Some(match implementation() {
        Some(offset) => ProbePoint { symbol, offset, implementation: true },
        None => ProbePoint { symbol, offset: export, implementation: false },
    })
}

/// [`probe_point`] for every symbol, reading and parsing the library once.
pub fn probe_points(pid: HostPid, library: &RuntimeLibrary, symbols: &[&'static str]) -> Vec<ProbePoint> {
    let Ok(bytes) = fs::read(Path::new(&library.open_path)) else { return Vec::new() };
    let Ok(elf) = object::File::parse(&*bytes) else { return Vec::new() };
    symbols.iter().filter_map(|s| probe_point(pid, library, &elf, s)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rocrs_thunks_are_decoded_to_their_table_slot() {
        // Debian's ROCr 5.2, hsa_signal_store_screlease at 0x70e80: mov 0x1dba09(%rip),%rax;
        // jmp *0x160(%rax).
        let code = [0x48, 0x8b, 0x05, 0x09, 0xba, 0x1d, 0x00, 0xff, 0xa0, 0x60, 0x01, 0x00, 0x00, 0x0f, 0x1f, 0x00];
        assert_eq!(thunk_slot(&code, 0x70e80), Some((0x24c890, 0x160)));
        // Trixie's 6.1, at 0x9bd30: endbr64; mov 0x25030d(%rip),%rax; jmp *0x160(%rax).
        let code =
            [0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x8b, 0x05, 0x0d, 0x03, 0x25, 0x00, 0xff, 0xa0, 0x60, 0x01, 0x00, 0x00];
        assert_eq!(thunk_slot(&code, 0x9bd30), Some((0x2ec048, 0x160)));
        // The stand-in runtime's (tests/rocm/hsa_store_stub.c, gcc -O2): a short displacement,
        // jmp *0x8(%rax), and none, jmp *(%rax).
        let code = [0x48, 0x8b, 0x05, 0x99, 0x2e, 0x00, 0x00, 0xff, 0x60, 0x08, 0x66, 0x0f];
        assert_eq!(thunk_slot(&code, 0x1180), Some((0x4020, 8)));
        let code = [0x48, 0x8b, 0x05, 0x89, 0x2e, 0x00, 0x00, 0xff, 0x20, 0x90, 0x90, 0x90];
        assert_eq!(thunk_slot(&code, 0x1190), Some((0x4020, 0)));
    }

    #[test]
    fn anything_else_is_no_thunk() {
        // The function itself (a push first), a GOT load, an indirect jump through memory.
        assert_eq!(thunk_slot(&[0x55, 0x53, 0x48, 0x83, 0xec, 0x08, 0x48, 0x85, 0xff, 0, 0, 0, 0], 0), None);
        assert_eq!(thunk_slot(&[0x48, 0x8b, 0x05, 1, 0, 0, 0, 0x48, 0x8b, 0x00, 0, 0, 0], 0), None);
        assert_eq!(thunk_slot(&[0xff, 0x25, 0, 0, 0, 0], 0), None);
        assert_eq!(thunk_slot(&[0x48, 0x8b, 0x05], 0), None);
    }
}
