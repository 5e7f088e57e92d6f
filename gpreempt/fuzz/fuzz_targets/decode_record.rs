//! Ring-buffer records: any bytes decode to an event or a counted error, never a panic; a
//! record that decodes also goes through the pipeline `gpreempt trace` runs (the model, the
//! filter, the JSON Lines and console sinks, the queue map and the summary).
#![no_main]

use gpreempt::{
    clock::WallClock,
    event::Losses,
    model::Model,
    pipeline::{Pipeline, filter::Filter},
    report::{console::Console, jsonl::JsonLines},
    trace::decode::decode,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(event) = decode(data) {
        let clock = WallClock::from_offset(0);
        let mut pipeline = Pipeline::new(Model::new(None), Filter::default());
        pipeline.add_sink(Box::new(JsonLines::new(std::io::sink(), clock)));
        pipeline.add_sink(Box::new(Console::new(std::io::sink(), clock, false)));
        pipeline.deliver(&event);
        pipeline.finish(event.ts_ns, Losses::default(), 0);
    }
});
