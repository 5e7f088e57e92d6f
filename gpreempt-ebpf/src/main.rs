//! gpreempt's eBPF programs: kprobes/kretprobes on the KFD paths of `amdgpu.ko`.
//!
//! One module per area ([`queue`], [`debug`], [`eviction`], [`hws`], [`process`], [`context`],
//! [`floor`]); [`maps`] holds the maps shared by all of them and the helpers every probe uses
//! (stash entry arguments for the kretprobe, write a record or count why not), [`pairs`] the two
//! shapes of entry/return pair.
#![no_std]
#![no_main]

mod context;
mod debug;
mod eviction;
mod floor;
mod hws;
mod maps;
mod pairs;
mod process;
mod queue;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any program that could reach this; it exists only to link.
    loop {}
}

// Required for GPL-only helpers (bpf_probe_read_kernel, bpf_ktime_get_boot_ns).
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
