//! Userspace throughput of the tracer's pipeline on one core (`cargo xtask bench`, row 2):
//! ring-buffer record bytes → `decode` → `Pipeline::deliver` (the model: span tracker and PID →
//! queue map; the filter), without sinks and with the JSON Lines sink, as `gpreempt trace
//! --json` runs it per event.
//!
//! The records are a create/destroy churn of 64 processes with 8 queues each plus failed creates,
//! built with the same `#[repr(C)]` types the eBPF programs write.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gpreempt::{
    clock::WallClock,
    model::Model,
    pipeline::{Pipeline, filter::Filter},
    report::jsonl::JsonLines,
    trace::decode::decode,
};
use gpreempt_common::{
    kfd_uapi::CreateQueueArgs,
    record::{COMM_LEN, CONTEXT_ID_PRIMARY, QueueCreateRecord, QueueDestroyRecord, RecordHeader, RecordKind},
};

fn bytes_of<T>(value: &T) -> Vec<u8> {
    // SAFETY: reading the bytes of a plain `#[repr(C)]` record.
    unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

fn header(kind: RecordKind, pid: u32, ts: u64) -> RecordHeader {
    let mut comm = [0u8; COMM_LEN];
    comm[..6].copy_from_slice(b"python");
    RecordHeader { kind: kind as u32, cpu: 0, entry_ns: ts, ts_ns: ts + 20_000, tgid: pid, tid: pid, comm }
}

/// 64 processes × 8 queues: create all, one failed create each, destroy all (1,088 records).
fn records() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut ts = 1_000_000u64;
    for pid in 1000..1064u32 {
        for q in 0..8u32 {
            ts += 1_000;
            let args = CreateQueueArgs {
                ring_base_address: 0x7f00_0000_0000 + u64::from(q) * 0x10_0000,
                write_pointer_address: 0x7f10_0000_0000 + u64::from(q) * 0x1000,
                read_pointer_address: 0x7f10_0000_0008 + u64::from(q) * 0x1000,
                doorbell_offset: 0x8000_0000_0000 | (u64::from(q) * 8),
                ring_size: 65536,
                gpu_id: 0xa1b2,
                queue_type: 2,
                queue_percentage: 100,
                queue_priority: 7,
                queue_id: q,
                ctx_save_restore_address: 0x7f20_0000_0000,
                ctx_save_restore_size: 0x2_0000,
                ..Default::default()
            };
            let header = header(RecordKind::QueueCreate, pid, ts);
            out.push(bytes_of(&QueueCreateRecord { header, args, context_id: CONTEXT_ID_PRIMARY, _pad: 0, ret: 0 }));
        }
        ts += 1_000;
        let bad = CreateQueueArgs { gpu_id: 0x1234, ring_size: 65536, queue_type: 2, ..Default::default() };
        out.push(bytes_of(&QueueCreateRecord {
            header: header(RecordKind::QueueCreate, pid, ts),
            args: bad,
            context_id: CONTEXT_ID_PRIMARY,
            _pad: 0,
            ret: -22,
        }));
    }
    for pid in 1000..1064u32 {
        for q in 0..8u32 {
            ts += 1_000;
            let record = QueueDestroyRecord {
                header: header(RecordKind::QueueDestroy, pid, ts),
                queue_id: q,
                context_id: CONTEXT_ID_PRIMARY,
                ret: 0,
            };
            out.push(bytes_of(&record));
        }
    }
    out
}

fn pipeline(c: &mut Criterion) {
    let records = records();
    let mut group = c.benchmark_group("pipeline");
    group.throughput(Throughput::Elements(records.len() as u64));
    group.bench_function("decode+map", |b| {
        b.iter(|| {
            let mut pipeline = Pipeline::new(Model::new(None), Filter::default());
            for r in &records {
                let Ok(event) = decode(black_box(r)) else { continue };
                pipeline.deliver(&event);
            }
            pipeline
        });
    });
    group.bench_function("decode+map+jsonl", |b| {
        let clock = WallClock::now();
        b.iter(|| {
            let mut pipeline = Pipeline::new(Model::new(None), Filter::default());
            pipeline.add_sink(Box::new(JsonLines::new(std::io::sink(), clock)));
            for r in &records {
                let Ok(event) = decode(black_box(r)) else { continue };
                pipeline.deliver(&event);
            }
            pipeline
        });
    });
    group.finish();
}

criterion_group!(benches, pipeline);
criterion_main!(benches);
