//! The BTF reader: base and split BTF from arbitrary bytes, then the offset queries the tracer
//! makes at start.
#![no_main]

use gpreempt::trace::btf::{Btf, config_from};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let split_at = data.first().map_or(0, |&b| usize::from(b) * data.len() / 256);
    let (base, split) = data.split_at(split_at.min(data.len()));
    for btf in [Btf::parse(data), Btf::parse_split(base, split, "fuzz")].into_iter().flatten() {
        let _ = config_from(&btf);
        let _ = btf.member_offset("queue", "properties.queue_id");
    }
});
