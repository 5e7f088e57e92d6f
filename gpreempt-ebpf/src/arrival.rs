//! The arrival probe (`gpreempt schedule`'s): a `cgroup_skb` ingress program on the online
//! processes' cgroups that sees a request reach the service's socket before the service reads it,
//! so the scheduler can start the offline side's SUSPENDs during the request's CPU phase
//! (tokenization, templating) instead of at its first kernel. An object of its own: the scheduler
//! loads five small maps and one program, none of the tracer's. See `gpreempt_common::arrival`.
//!
//! Where it runs: `tcp_v4_rcv`/`tcp_v6_rcv` → `tcp_filter` → `sk_filter_trim_cap` →
//! `BPF_CGROUP_RUN_PROG_INET_INGRESS` on the receiving socket's cgroup, with `skb->data` pushed back
//! to the network header (`__cgroup_bpf_run_filter_skb`, kernel/bpf/cgroup.c, Linux 5.10-6.12): the
//! bytes read here start with the IP header, whatever the device.
//!
//! Every path returns 1 ("pass"): the program never drops, delays or alters a packet. No atomics
//! (the bpf target's core has none before Linux 5.12's exchange instructions): the counts are per
//! CPU and a slot armed on two CPUs at once merely sends two hits (the reader takes the first).
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{bpf_ktime_get_ns, bpf_skb_load_bytes},
    macros::{cgroup_skb, map},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::SkBuffContext,
};
use gpreempt_common::arrival::{
    ARMED_MAP_FLAGS, ArrivalCounts, ArrivalHit, HEAD_BYTES, HITS_BYTES, MAX_PATTERNS, MAX_PORTS, MAX_SLOTS,
    PREFIX_BYTES, PREFIX_WORDS, Pattern, VERDICT_ALLOW, VERDICT_DENY,
};

/// Watched local port → the online process's slot.
#[map]
static ARRIVAL_PORTS: HashMap<u32, u32> = HashMap::with_max_entries(MAX_PORTS, 0);

/// Slot → armed (non-zero) or not; userspace arms through its mapping of the values.
#[map]
static ARRIVAL_ARMED: Array<u32> = Array::with_max_entries(MAX_SLOTS, ARMED_MAP_FLAGS);

#[map]
static ARRIVAL_PATTERNS: Array<Pattern> = Array::with_max_entries(MAX_PATTERNS, 0);

#[map]
static ARRIVAL_COUNTS: PerCpuArray<ArrivalCounts> = PerCpuArray::with_max_entries(MAX_SLOTS, 0);

#[map]
static ARRIVAL_HITS: RingBuf = RingBuf::with_byte_size(HITS_BYTES, 0);

const IPPROTO_TCP: u8 = 6;

#[cgroup_skb(ingress)]
pub fn arrival_ingress(ctx: SkBuffContext) -> i32 {
    let _ = classify(&ctx);
    1
}

/// A TCP segment's local port, payload offset and payload length, from the IP and TCP headers.
#[inline(always)]
fn segment(ctx: &SkBuffContext) -> Option<(u16, usize, usize)> {
    let first: u8 = ctx.load(0).ok()?;
    let (l4, total) = match first >> 4 {
        4 => {
            if ctx.load::<u8>(9).ok()? != IPPROTO_TCP {
                return None;
            }
            // A later fragment carries no TCP header (the stack reassembles before the socket,
            // so this is only a guard).
            if u16::from_be(ctx.load::<u16>(6).ok()?) & 0x1fff != 0 {
                return None;
            }
            (usize::from(first & 0x0f) * 4, usize::from(u16::from_be(ctx.load::<u16>(2).ok()?)))
        }
        // IPv6 with TCP right after the fixed header; extension headers are not followed (rare on
        // a service's traffic; such a segment is passed unclassified).
        6 => {
            if ctx.load::<u8>(6).ok()? != IPPROTO_TCP {
                return None;
            }
            (40, 40 + usize::from(u16::from_be(ctx.load::<u16>(4).ok()?)))
        }
        _ => return None,
    };
    let port = u16::from_be(ctx.load::<u16>(l4 + 2).ok()?);
    let payload = l4 + usize::from(ctx.load::<u8>(l4 + 12).ok()? >> 4) * 4;
    // A bare ACK, SYN or FIN carries nothing.
    let len = total.checked_sub(payload).filter(|&n| n > 0)?;
    Some((port, payload, len))
}

/// The payload's first bytes into `prefix` (zero past a short payload): constant-size loads,
/// largest first, so the verifier sees a fixed length on each.
#[inline(always)]
fn load_prefix(ctx: &SkBuffContext, offset: usize, prefix: &mut [u64; PREFIX_WORDS]) -> bool {
    let dst = prefix.as_mut_ptr().cast::<core::ffi::c_void>();
    for len in [PREFIX_BYTES as u32, 16, 8] {
        // SAFETY: `dst` is `prefix`, which holds PREFIX_BYTES ≥ `len` bytes; the helper checks the
        // offset and length against the packet.
        if unsafe { bpf_skb_load_bytes(ctx.skb.skb.cast(), offset as u32, dst, len) } == 0 {
            return true;
        }
    }
    false
}

#[inline(always)]
fn matches(p: &Pattern, prefix: &[u64; PREFIX_WORDS]) -> bool {
    (prefix[0] & p.mask[0]) == p.words[0]
        && (prefix[1] & p.mask[1]) == p.words[1]
        && (prefix[2] & p.mask[2]) == p.words[2]
        && (prefix[3] & p.mask[3]) == p.words[3]
}

fn classify(ctx: &SkBuffContext) -> Option<()> {
    let (port, offset, len) = segment(ctx)?;
    // SAFETY: a map value the helper returned; userspace writes it only between packets it
    // watches, and a value is read once.
    let slot = unsafe { *ARRIVAL_PORTS.get(&u32::from(port))? };
    let counts = ARRIVAL_COUNTS.get_ptr_mut(slot)?;
    let mut prefix = [0u64; PREFIX_WORDS];
    let loaded = load_prefix(ctx, offset, &mut prefix);
    let (mut allow, mut deny, mut any_allow) = (false, false, false);
    if loaded {
        for i in 0..MAX_PATTERNS {
            let Some(p) = ARRIVAL_PATTERNS.get(i) else { break };
            if p.verdict == VERDICT_DENY && matches(p, &prefix) {
                deny = true;
            } else if p.verdict == VERDICT_ALLOW {
                any_allow = true;
                allow |= matches(p, &prefix);
            }
        }
    }
    let request = loaded && !deny && (allow || !any_allow);
    let first = prefix[0] as u8;
    let tls = (first == 0x16 || first == 0x17) && (prefix[0] >> 8) as u8 == 0x03;
    // SAFETY: this CPU's value of the slot's entry, which only this program on this CPU writes (a
    // cgroup_skb ingress program runs in softirq, not preempted on its CPU).
    unsafe {
        (*counts).segments += 1;
        if deny {
            (*counts).denied += 1;
        } else if request {
            (*counts).allowed += 1;
        } else {
            (*counts).unmatched += 1;
            if tls {
                (*counts).tls += 1;
            }
        }
    }
    if !request {
        return None;
    }
    let armed = ARRIVAL_ARMED.get_ptr_mut(slot)?;
    // SAFETY: a map value pointer the helper returned; userspace writes it too (re-arming), so
    // volatile accesses.
    let credits = unsafe { core::ptr::read_volatile(armed) };
    if credits == 0 {
        return None;
    }
    // One credit taken (two CPUs taking the same one at once merely send one record more).
    // SAFETY: as above.
    unsafe { core::ptr::write_volatile(armed, credits - 1) };
    // SAFETY: as for the counts above.
    unsafe { (*counts).armings += 1 };
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let ktime_ns = unsafe { bpf_ktime_get_ns() };
    // A full ring (the reader stopped) drops the hit: the doorbell probe and the poll still see
    // the request's kernels.
    let mut entry = ARRIVAL_HITS.reserve::<ArrivalHit>(0)?;
    let hit = entry.as_mut_ptr();
    // SAFETY: `hit` is the reserved record, ArrivalHit-sized; every field is written before the
    // submit (the head's bytes past `head_len` stay unspecified, as the type says).
    unsafe {
        (*hit).slot = slot;
        (*hit).port = u32::from(port);
        (*hit).payload_len = len as u32;
        (*hit).ktime_ns = ktime_ns;
        (*hit).head_len = load_head(ctx, offset, len, (*hit).head.as_mut_ptr().cast());
    }
    entry.submit(0);
    Some(())
}

/// The payload's first min(`len`, HEAD_BYTES) bytes into `dst` (HEAD_BYTES long): their count,
/// or 0 if the helper refused.
///
/// The helper's size must be provably within 1..=HEAD_BYTES in the register it is passed in
/// (Linux 5.10's verifier: "R3 min value is outside of the allowed memory range" for a size of
/// umin 0, which is what a `min` and an `== 0` check compile to, the check folded away by LLVM
/// or made on another register). So the count is read back opaquely and masked: ((n − 1) &
/// (HEAD_BYTES − 1)) + 1 is n for every n in 1..=HEAD_BYTES, and its bounds are the mask's.
#[inline(always)]
fn load_head(ctx: &SkBuffContext, offset: usize, len: usize, dst: *mut core::ffi::c_void) -> u32 {
    const _: () = assert!(HEAD_BYTES.is_power_of_two());
    let n = core::cmp::min(len, HEAD_BYTES) as u64;
    // SAFETY: a read of a local.
    let n = unsafe { core::ptr::read_volatile(&n) };
    let n = (n.wrapping_sub(1) & (HEAD_BYTES as u64 - 1)) + 1;
    // SAFETY: `dst` holds HEAD_BYTES ≥ `n` bytes; the helper checks offset and length against the
    // packet.
    if unsafe { bpf_skb_load_bytes(ctx.skb.skb.cast(), offset as u32, dst, n as u32) } == 0 { n as u32 } else { 0 }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any program that could reach this; it exists only to link.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
