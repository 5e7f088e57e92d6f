//! `/proc/kallsyms` parsing and probe-table resolution.
#![no_main]

use gpreempt::trace::{
    probes::{PROBES, resolve},
    symbols::{Kallsyms, base_name},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let k = Kallsyms::parse(&text);
    let _ = k.kfd_module();
    let _ = resolve(PROBES, &k, None);
    for line in text.lines().take(64) {
        let _ = base_name(line);
    }
});
