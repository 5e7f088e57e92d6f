//! The arrival probe's maps and records (`gpreempt-ebpf`'s `arrival` object, read by
//! `gpreempt::schedule::arrival`).
//!
//! A `cgroup_skb` ingress program on an online process's cgroup (v2) sees every packet delivered
//! to a socket of that cgroup, in softirq, before the server's thread wakes. It keeps only TCP
//! segments that carry payload to a watched local port ([`PORTS_MAP`]: port → the online
//! process's slot), reads the payload's first [`PREFIX_BYTES`] and classifies them with the
//! [`Pattern`]s of [`PATTERNS_MAP`]: a deny pattern that matches (a health probe, a scrape) wins,
//! then an allow pattern (an HTTP `POST`, an HTTP/2 HEADERS frame); with no allow pattern
//! configured every payload that no deny pattern matches is a request. A request on a slot whose
//! [`ARMED_MAP`] entry (its credits) is non-zero takes one credit and sends one [`ArrivalHit`] to
//! [`HITS_MAP`]; arming a slot gives it [`ARMED_CREDITS`], so at most that many requests reach
//! userspace between two of the scheduler's looks, each with its own record.
//!
//! The program never drops, delays or alters a packet: it returns "pass" (1) on every path.

/// Map names in the object (the userspace side looks them up by these).
pub const PORTS_MAP: &str = "ARRIVAL_PORTS";
pub const ARMED_MAP: &str = "ARRIVAL_ARMED";
/// [`ARMED_MAP`]'s flags: BPF_F_MMAPABLE (include/uapi/linux/bpf.h, Linux 5.5; array maps only):
/// userspace maps its values and arms a slot with a store, not a `BPF_MAP_UPDATE_ELEM` syscall
/// (the re-arm comes in the step that takes a hit, before its SUSPENDs). Each value sits at
/// `slot` × [`ARMED_STRIDE`] bytes of the mapping (kernel/bpf/arraymap.c: `elem_size` is the value
/// size rounded up to 8).
pub const ARMED_MAP_FLAGS: u32 = 1 << 10;
pub const ARMED_STRIDE: usize = 8;
/// The records a slot may send between two re-arms. More than one: two requests that reach the
/// service microseconds apart (a client's burst; the native harness's Poisson load had two 6 µs
/// apart) arrive before the reaction thread can take the first record and arm the slot again
/// (its wake alone is tens of µs), and the second, unrecorded, found the offline side running at
/// its first kernel. Bounded: a flood of requests costs at most this many records per look.
pub const ARMED_CREDITS: u32 = 8;
pub const PATTERNS_MAP: &str = "ARRIVAL_PATTERNS";
pub const COUNTS_MAP: &str = "ARRIVAL_COUNTS";
pub const HITS_MAP: &str = "ARRIVAL_HITS";
/// The `cgroup_skb/ingress` program, attached once per online cgroup.
pub const PROGRAM: &str = "arrival_ingress";
/// Online processes watched at once (slots), every cgroup together.
pub const MAX_SLOTS: u32 = 256;
/// Watched local ports, every online process together.
pub const MAX_PORTS: u32 = 1024;
/// Allow and deny patterns together.
pub const MAX_PATTERNS: u32 = 16;
/// Payload bytes a pattern can match: four little-endian words.
pub const PREFIX_WORDS: usize = 4;
pub const PREFIX_BYTES: usize = PREFIX_WORDS * 8;
/// The payload's first bytes a hit carries ([`ArrivalHit::head`]): an HTTP/1.1 request's header
/// block, whose `Content-Length` gives the request's size where its body follows in later
/// segments (a body larger than the MSS, 1448 bytes on a 1500-byte Ethernet MTU, or headers and
/// body written apart by the client).
pub const HEAD_BYTES: usize = 512;
/// Ring buffer size: at most one hit per slot is in flight between two re-arms (256 of 536 bytes).
pub const HITS_BYTES: u32 = 256 * 1024;

/// A pattern's verdict ([`Pattern::verdict`]); 0 is an unused entry.
pub const VERDICT_UNUSED: u32 = 0;
pub const VERDICT_ALLOW: u32 = 1;
pub const VERDICT_DENY: u32 = 2;

/// One prefix pattern: the payload matches when `(prefix[i] & mask[i]) == words[i]` for each of
/// the four little-endian words of its first [`PREFIX_BYTES`] (bytes past the payload read 0).
/// A mask selects bytes, so a pattern can test one byte at any offset (an HTTP/2 frame's type).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pattern {
    pub words: [u64; PREFIX_WORDS],
    pub mask: [u64; PREFIX_WORDS],
    pub verdict: u32,
    pub _pad: u32,
}

/// Per slot and CPU: what the program saw (the tests' exact counts); summed over the CPUs, the
/// scheduler's report carries it as it is (`counts` of an online process's arrival path).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize))]
pub struct ArrivalCounts {
    /// TCP segments with payload to a watched port of this slot.
    pub segments: u64,
    /// Of them: matched an allow pattern (or any payload with no allow pattern configured).
    pub allowed: u64,
    /// Matched a deny pattern.
    pub denied: u64,
    /// Matched neither (a request body's later segments, a protocol not listed).
    pub unmatched: u64,
    /// Of the unmatched, those that start like a TLS record (0x16 or 0x17, then 0x03): the first
    /// bytes are opaque, so no pattern can tell a request from a probe.
    pub tls: u64,
    /// Allowed segments that found the slot armed: hits sent.
    pub armings: u64,
}

impl ArrivalCounts {
    /// Another CPU's counts added to these (userspace sums the per-CPU map).
    pub fn add(&mut self, other: &Self) {
        self.segments += other.segments;
        self.allowed += other.allowed;
        self.denied += other.denied;
        self.unmatched += other.unmatched;
        self.tls += other.tls;
        self.armings += other.armings;
    }
}

/// The first request on an armed slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArrivalHit {
    pub slot: u32,
    /// The local port it arrived on.
    pub port: u32,
    /// The segment's payload bytes (the request's size when it fits one segment: the lead from
    /// arrival to the first kernel grows with the prompt).
    pub payload_len: u32,
    /// Bytes of [`Self::head`] the program could read (0: none).
    pub head_len: u32,
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC, the clock the scheduler stamps with.
    pub ktime_ns: u64,
    /// The payload's first `head_len` bytes (the rest unspecified).
    pub head: [u8; HEAD_BYTES],
}

impl Default for ArrivalHit {
    fn default() -> Self {
        Self { slot: 0, port: 0, payload_len: 0, head_len: 0, ktime_ns: 0, head: [0; HEAD_BYTES] }
    }
}

impl ArrivalHit {
    /// The payload's first bytes the program read.
    pub fn head(&self) -> &[u8] {
        &self.head[..(self.head_len as usize).min(HEAD_BYTES)]
    }
}

const _: () = {
    assert!(core::mem::size_of::<Pattern>() == 72);
    assert!(core::mem::size_of::<ArrivalCounts>() == 48);
    assert!(core::mem::size_of::<ArrivalHit>() == 24 + HEAD_BYTES);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: `#[repr(C)]` structs of integers with no padding (sizes asserted above): every bit
    // pattern is a valid value.
    unsafe impl aya::Pod for super::Pattern {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ArrivalCounts {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ArrivalHit {}
}
