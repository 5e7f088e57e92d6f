//! `/sys/kernel/debug/kfd/{mqds,hqds,rls}` parsers: errors name a line, never panic.
#![no_main]

use gpreempt::host::debugfs::{parse_hqds, parse_mqds, parse_rls};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = parse_mqds(&text);
    let _ = parse_hqds(&text);
    let _ = parse_rls(&text);
});
