//! Ring-buffer records: any bytes decode to an event or a counted error, never a panic; a
//! record that decodes also serialises (the JSON Lines sink) and feeds the model.
#![no_main]

use gpreempt::{
    model::{registry::Registry, spans::SpanTracker},
    trace::decode::decode,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(event) = decode(data) {
        let _ = serde_json::to_string(&event);
        let registry = Registry::new(None);
        let mut spans = SpanTracker::default();
        let _ = spans.on_event(&event, &registry);
        let mut registry = registry;
        registry.apply(&event);
    }
});
