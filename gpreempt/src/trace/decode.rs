//! Ring-buffer records → owned [`Event`](crate::event::Event)s.
//!
//! Records are read with unaligned copies after a length check; a short record or an unknown
//! kind is a [`DecodeError`] the stream counts, never a panic.

use std::mem::size_of;

use crate::{
    domain::{DebugTrapOp, EvictionTrigger, GpuId, HostPid, QueueId, QueueType},
    event::*,
    kfd::uapi::QueueOutcome,
};
use gpreempt_common::{
    kfd_uapi::{dbg_trap_op, runtime_enable},
    record::{
        CallPhase, DebugTrapRecord, KfdCallRecord, KfdFn, ProcessCreateRecord, QueueCreateRecord, QueueDestroyRecord,
        QueueSuspendRecord, QueueUpdateRecord, Record, RecordHeader, RecordKind, RuntimeEnableRecord, SmiQueueRecord,
    },
};

fn nonzero(v: u32) -> Option<u32> {
    (v != 0).then_some(v)
}

fn kfd_call(r: &KfdCallRecord) -> Result<EventKind, DecodeError> {
    let kfd_fn = KfdFn::try_from(r.function).map_err(DecodeError::UnknownFunction)?;
    let phase = CallPhase::try_from(r.phase).map_err(DecodeError::UnknownPhase)?;
    let function = kfd_fn.name();
    let owner_pid = nonzero(r.owner).map(HostPid);
    Ok(match kfd_fn {
        KfdFn::GpuReset => EventKind::GpuReset(GpuReset { alarm: "GPU reset: queued work of every process is lost" }),
        KfdFn::ProcessDequeueAll | KfdFn::ProcessRelease => {
            EventKind::ProcessExit(ProcessExit { owner_pid, stage: function })
        }
        KfdFn::ProcfsDelQueue => EventKind::QueueRemoved(QueueRemoved {
            owner_pid,
            queue_id: u32::try_from(r.args[0]).ok().filter(|&q| q != u32::MAX).map(QueueId),
            context_id: context_id_of_wire(r.args[1] as u32),
        }),
        KfdFn::QueueSetReset => EventKind::QueueReset(QueueReset {
            owner_pid,
            gpu_id: nonzero(r.gpu_id).map(GpuId),
            queue_id: u32::try_from(r.args[0]).ok().filter(|&q| q != u32::MAX).map(QueueId),
            context_id: context_id_of_wire(r.args[1] as u32),
        }),
        KfdFn::ContextCreate => {
            let ret = i64::from(r.ret as i32);
            EventKind::ContextCreate(ContextCreate {
                context_id: u16::try_from(r.args[0]).ok(),
                result: KernelResult(ret.min(0)),
                ret,
            })
        }
        f => {
            if phase != CallPhase::Return {
                return Err(DecodeError::UnknownFunction(r.function));
            }
            let a = r.args;
            let lo = |v: u64| v as u32;
            let mut c = KfdCall {
                function,
                kfd_fn: f,
                owner_pid,
                gpu_id: nonzero(r.gpu_id).map(GpuId),
                trigger: None,
                filter: None,
                filter_param: None,
                grace_period: None,
                fence_value: None,
                timeout_ms: None,
                result: KernelResult(i64::from(r.ret as i32)),
                ret: i64::from(r.ret as i32),
            };
            match f {
                KfdFn::ProcessEvictQueues => c.trigger = Some(EvictionTrigger::from_raw(lo(a[0]))),
                KfdFn::ExecuteQueuesCpsch | KfdFn::UnmapQueuesCpsch => {
                    c.filter = Some(lo(a[0]));
                    c.filter_param = Some(lo(a[1]));
                    // 6.1 has no grace_period argument (the register holds garbage); 0xffffffff
                    // is USE_DEFAULT_GRACE_PERIOD on 6.12.
                    c.grace_period = Some(lo(a[2]));
                }
                KfdFn::PmSendUnmapQueue => {
                    c.filter = Some(lo(a[0]));
                    c.filter_param = Some(lo(a[1]));
                }
                KfdFn::FenceWaitTimeout => {
                    c.fence_value = Some(a[0]);
                    c.timeout_ms = Some(lo(a[1]));
                }
                _ => {}
            }
            EventKind::KfdCall(c)
        }
    })
}

fn debug_trap(r: &DebugTrapRecord) -> DebugTrap {
    let a = &r.args;
    let op = a.op;
    let mut d = DebugTrap {
        target_pid: a.pid,
        op: DebugTrapOp(op),
        exception_mask: None,
        num_queues: None,
        grace_period: None,
        dbg_fd: None,
        result: KernelResult(r.ret.min(0)),
        ret: r.ret,
    };
    match op {
        dbg_trap_op::ENABLE => {
            d.exception_mask = Some(a.exception_mask());
            d.dbg_fd = Some((a.data[2] >> 32) as u32);
        }
        dbg_trap_op::SUSPEND_QUEUES => {
            d.exception_mask = Some(a.exception_mask());
            d.num_queues = Some(a.num_queues());
            d.grace_period = Some(a.grace_period());
        }
        dbg_trap_op::RESUME_QUEUES | dbg_trap_op::GET_QUEUE_SNAPSHOT | dbg_trap_op::GET_DEVICE_SNAPSHOT => {
            d.num_queues = Some(a.num_queues());
        }
        dbg_trap_op::SET_EXCEPTIONS_ENABLED | dbg_trap_op::QUERY_DEBUG_EVENT | dbg_trap_op::SEND_RUNTIME_EVENT => {
            d.exception_mask = Some(a.exception_mask());
        }
        _ => {}
    }
    d
}

fn suspend(r: &QueueSuspendRecord) -> QueueSuspend {
    let n = (r.ids_read as usize).min(r.queue_ids.len());
    let queues = r.queue_ids[..n].iter().map(|&raw| QueueOutcome::from_raw(raw)).collect();
    let resume = r.resume != 0;
    QueueSuspend {
        target_pid: nonzero(r.target).map(HostPid),
        num_queues: r.num_queues,
        grace_period: (!resume).then_some(r.grace_period),
        exception_clear_mask: (!resume).then_some(r.exception_clear_mask),
        queues,
        handled: u32::try_from(r.ret).ok(),
        result: KernelResult(r.ret.min(0)),
        ret: r.ret,
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("unknown KFD function id {0} (or an entry record for a return-only function)")]
    UnknownFunction(u32),
    #[error("unknown call phase {0}")]
    UnknownPhase(u32),
    #[error("record of {len} bytes is shorter than its {need}-byte {what}")]
    Short { len: usize, need: usize, what: &'static str },
    #[error("unknown record kind {0}")]
    UnknownKind(u32),
}

fn read_pod<T: aya::Pod>(bytes: &[u8], what: &'static str) -> Result<T, DecodeError> {
    let need = size_of::<T>();
    if bytes.len() < need {
        return Err(DecodeError::Short { len: bytes.len(), need, what });
    }
    // SAFETY: length checked; `T: Pod` is plain old data, valid for any bytes.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// The record `R` at the start of `bytes` (whose header said `R::KIND`).
fn read<R: Record + aya::Pod>(bytes: &[u8]) -> Result<R, DecodeError> {
    read_pod(bytes, R::NAME)
}

fn comm(raw: &[u8]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

/// Decode one ring-buffer record.
pub fn decode(bytes: &[u8]) -> Result<Event, DecodeError> {
    let header: RecordHeader = read_pod(bytes, "header")?;
    let kind = match RecordKind::try_from(header.kind).map_err(DecodeError::UnknownKind)? {
        RecordKind::QueueCreate => {
            let r: QueueCreateRecord = read(bytes)?;
            let a = r.args;
            let ok = r.ret >= 0;
            EventKind::QueueCreate(QueueCreate {
                queue_id: ok.then_some(QueueId(a.queue_id)),
                context_id: context_id_of_wire(r.context_id),
                gpu_id: GpuId(a.gpu_id),
                queue_type: QueueType::from_raw(a.queue_type),
                priority: a.queue_priority,
                percentage: a.queue_percentage,
                ring_base: a.ring_base_address,
                ring_size: a.ring_size,
                read_pointer: a.read_pointer_address,
                write_pointer: a.write_pointer_address,
                doorbell_offset: ok.then_some(a.doorbell_offset),
                eop_buffer: a.eop_buffer_address,
                eop_buffer_size: a.eop_buffer_size,
                cwsr_address: a.ctx_save_restore_address,
                cwsr_size: a.ctx_save_restore_size,
                ctl_stack_size: a.ctl_stack_size,
                result: KernelResult(r.ret),
                ret: r.ret,
            })
        }
        RecordKind::QueueDestroy => {
            let r: QueueDestroyRecord = read(bytes)?;
            EventKind::QueueDestroy(QueueDestroy {
                queue_id: QueueId(r.queue_id),
                context_id: context_id_of_wire(r.context_id),
                result: KernelResult(r.ret),
                ret: r.ret,
            })
        }
        RecordKind::QueueUpdate => {
            let r: QueueUpdateRecord = read(bytes)?;
            EventKind::QueueUpdate(QueueUpdate {
                queue_id: QueueId(r.args.queue_id),
                context_id: context_id_of_wire(r.context_id),
                ring_base: r.args.ring_base_address,
                ring_size: r.args.ring_size,
                percentage: r.args.queue_percentage,
                priority: r.args.queue_priority,
                result: KernelResult(r.ret),
                ret: r.ret,
            })
        }
        RecordKind::DebugTrap => EventKind::DebugTrap(debug_trap(&read(bytes)?)),
        RecordKind::RuntimeEnable => {
            let r: RuntimeEnableRecord = read(bytes)?;
            EventKind::RuntimeEnable(RuntimeEnable {
                enable: r.args.mode_mask & runtime_enable::MODE_ENABLE_MASK != 0,
                ttmp_save: r.args.mode_mask & runtime_enable::MODE_TTMP_SAVE_MASK != 0,
                r_debug: r.args.r_debug,
                result: KernelResult(r.ret),
                ret: r.ret,
            })
        }
        RecordKind::SmiQueue => {
            let r: SmiQueueRecord = read(bytes)?;
            if r.restore != 0 {
                EventKind::QueueRestore(QueueRestore {
                    target_pid: HostPid(r.pid),
                    gpu_id: nonzero(r.gpu_id).map(GpuId),
                })
            } else {
                EventKind::QueueEviction(QueueEviction {
                    target_pid: HostPid(r.pid),
                    gpu_id: nonzero(r.gpu_id).map(GpuId),
                    trigger: EvictionTrigger::from_raw(r.trigger),
                })
            }
        }
        RecordKind::KfdCall => kfd_call(&read(bytes)?)?,
        RecordKind::QueueSuspend => {
            let r: QueueSuspendRecord = read(bytes)?;
            if r.resume != 0 { EventKind::ResumeQueues(suspend(&r)) } else { EventKind::SuspendQueues(suspend(&r)) }
        }
        RecordKind::ProcessCreate => {
            let r: ProcessCreateRecord = read(bytes)?;
            EventKind::ProcessOpen(ProcessOpen { owner_pid: HostPid(r.tgid), kfd_process: r.process })
        }
    };
    Ok(Event {
        ts_ns: header.ts_ns,
        entry_ns: header.entry_ns,
        cpu: header.cpu,
        pid: HostPid(header.tgid),
        tid: header.tid,
        comm: comm(&header.comm),
        kind,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use gpreempt_common::{
        kfd_uapi::CreateQueueArgs,
        record::{COMM_LEN, CONTEXT_ID_PRIMARY},
    };

    use super::*;

    pub(crate) fn bytes_of<T>(value: &T) -> Vec<u8> {
        // SAFETY: reading the bytes of a plain `#[repr(C)]` record without padding.
        unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    pub(crate) fn header(kind: RecordKind, tgid: u32, comm: &str) -> RecordHeader {
        let mut c = [0u8; COMM_LEN];
        c[..comm.len()].copy_from_slice(comm.as_bytes());
        RecordHeader { kind: kind as u32, cpu: 1, entry_ns: 1_000, ts_ns: 4_500, tgid, tid: tgid + 1, comm: c }
    }

    #[test]
    fn decodes_a_failed_create_with_exact_arguments() {
        let rec = QueueCreateRecord {
            header: header(RecordKind::QueueCreate, 4242, "kfd-client"),
            args: CreateQueueArgs {
                ring_base_address: 0x7f00_0000_0000,
                write_pointer_address: 0x7f00_0000_1000,
                read_pointer_address: 0x7f00_0000_2000,
                doorbell_offset: 0,
                ring_size: 65536,
                gpu_id: 0x1234,
                queue_type: 2,
                queue_percentage: 100,
                queue_priority: 7,
                queue_id: 0xffff_ffff,
                eop_buffer_address: 0,
                eop_buffer_size: 0,
                ctx_save_restore_address: 0x7f00_1000_0000,
                ctx_save_restore_size: 0x5000,
                ctl_stack_size: 0x1000,
            },
            context_id: CONTEXT_ID_PRIMARY,
            _pad: 0,
            ret: -22,
        };
        let e = decode(&bytes_of(&rec)).unwrap();
        assert_eq!((e.pid, e.tid, e.comm.as_str(), e.cpu), (HostPid(4242), 4243, "kfd-client", 1));
        assert_eq!(e.duration_ns(), 3_500);
        let EventKind::QueueCreate(c) = e.kind else { panic!("wrong kind") };
        assert_eq!(c.queue_id, None, "a failed create assigns no queue id");
        assert_eq!(c.context_id, None, "the primary context");
        assert_eq!(c.gpu_id, GpuId(0x1234));
        assert_eq!(c.queue_type, QueueType::ComputeAql);
        assert_eq!((c.priority, c.percentage, c.ring_size), (7, 100, 65536));
        assert_eq!(c.cwsr_address, 0x7f00_1000_0000);
        assert_eq!(c.cwsr_size, 0x5000);
        assert_eq!(c.result.name(), "EINVAL");
        assert_eq!(c.ret, -22);
    }

    #[test]
    fn decodes_a_successful_create_and_a_destroy() {
        let mut rec = QueueCreateRecord {
            header: header(RecordKind::QueueCreate, 1, "x"),
            args: CreateQueueArgs { queue_id: 3, doorbell_offset: 0x1000, queue_type: 9, ..Default::default() },
            context_id: 2,
            _pad: 0,
            ret: 0,
        };
        let EventKind::QueueCreate(c) = decode(&bytes_of(&rec)).unwrap().kind else { panic!() };
        assert_eq!(
            (c.queue_id, c.context_id, c.doorbell_offset, c.queue_type),
            (Some(QueueId(3)), Some(2), Some(0x1000), QueueType::Other(9))
        );
        assert_eq!(c.result.name(), "OK");
        rec.ret = -4095;
        let EventKind::QueueCreate(c) = decode(&bytes_of(&rec)).unwrap().kind else { panic!() };
        assert_eq!(c.result.name(), "E4095");
        // The fuzzer's first find: negating i64::MIN overflowed.
        assert_eq!(KernelResult(i64::MIN).name(), "-9223372036854775808");
        assert_eq!(KernelResult(-(1 << 40)).name(), "-1099511627776");

        let d = QueueDestroyRecord {
            header: header(RecordKind::QueueDestroy, 9, "y"),
            queue_id: 42,
            context_id: 0,
            ret: -22,
        };
        let e = decode(&bytes_of(&d)).unwrap();
        assert_eq!(
            e.kind,
            EventKind::QueueDestroy(QueueDestroy {
                queue_id: QueueId(42),
                context_id: Some(0),
                result: KernelResult(-22),
                ret: -22
            })
        );
    }

    #[test]
    fn short_and_unknown_records_are_errors() {
        assert_eq!(decode(&[0u8; 10]), Err(DecodeError::Short { len: 10, need: 48, what: "header" }));
        let h = header(RecordKind::QueueCreate, 1, "x");
        assert_eq!(decode(&bytes_of(&h)), Err(DecodeError::Short { len: 48, need: 152, what: "queue_create record" }));
        let mut unknown = h;
        unknown.kind = 999;
        assert_eq!(decode(&bytes_of(&unknown)), Err(DecodeError::UnknownKind(999)));
    }

    #[test]
    fn json_field_names_are_stable() {
        let d = QueueDestroyRecord {
            header: header(RecordKind::QueueDestroy, 9, "y"),
            queue_id: 42,
            context_id: CONTEXT_ID_PRIMARY,
            ret: -22,
        };
        let json = serde_json::to_value(decode(&bytes_of(&d)).unwrap()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"ts_ns": 4500, "entry_ns": 1000, "cpu": 1, "pid": 9, "tid": 10, "comm": "y",
                "event": "queue_destroy", "queue_id": 42, "context_id": null, "result": "EINVAL", "ret": -22})
        );
        let secondary = QueueDestroyRecord { context_id: 0, ..d };
        let json = serde_json::to_value(decode(&bytes_of(&secondary)).unwrap()).unwrap();
        assert_eq!((json["queue_id"].as_u64(), json["context_id"].as_u64()), (Some(42), Some(0)));
    }

    #[test]
    fn decodes_debug_trap_suspend_and_the_kernel_suspend_with_outcome_bits() {
        use gpreempt_common::{
            kfd_uapi::DbgTrapArgs,
            record::{DebugTrapRecord, MAX_QUEUE_IDS, QueueSuspendRecord},
        };
        let t = DebugTrapRecord {
            header: header(RecordKind::DebugTrap, 50, "dbg"),
            args: DbgTrapArgs::suspend_queues(77, 0x4000_0000, 0x1000, 3, 5),
            ret: 2,
        };
        let EventKind::DebugTrap(d) = decode(&bytes_of(&t)).unwrap().kind else { panic!() };
        assert_eq!(
            (d.target_pid, d.op, d.num_queues, d.grace_period),
            (77, DebugTrapOp::SUSPEND_QUEUES, Some(3), Some(5))
        );
        assert_eq!((d.exception_mask, d.dbg_fd, d.result.name(), d.ret), (Some(0x4000_0000), None, "OK".to_owned(), 2));

        let mut ids = [0u32; MAX_QUEUE_IDS];
        ids[..3].copy_from_slice(&[0, 1 | 1 << 31, 2 | 1 << 30]);
        let r = QueueSuspendRecord {
            header: header(RecordKind::QueueSuspend, 50, "dbg"),
            target: 77,
            num_queues: 3,
            grace_period: 5,
            resume: 0,
            exception_clear_mask: 0x10,
            ids_read: 3,
            _pad: 0,
            queue_ids: ids,
            ret: 1,
        };
        let e = decode(&bytes_of(&r)).unwrap();
        assert_eq!(e.kind.name(), "suspend_queues");
        let EventKind::SuspendQueues(s) = e.kind else { panic!() };
        assert_eq!(
            s.queues,
            [
                QueueOutcome { queue_id: QueueId(0), invalid: false, error: false },
                QueueOutcome { queue_id: QueueId(1), invalid: true, error: false },
                QueueOutcome { queue_id: QueueId(2), invalid: false, error: true },
            ]
        );
        assert_eq!(
            (s.target_pid, s.handled, s.grace_period, s.exception_clear_mask),
            (Some(HostPid(77)), Some(1), Some(5), Some(0x10))
        );
        // A resume from DISABLE: no array, no suspend-only fields; an ids_read beyond the array is clamped.
        let resume = QueueSuspendRecord { resume: 1, num_queues: 0, ids_read: 99, ret: 0, ..r };
        let EventKind::ResumeQueues(s) = decode(&bytes_of(&resume)).unwrap().kind else { panic!() };
        assert_eq!((s.queues.len(), s.grace_period, s.exception_clear_mask), (MAX_QUEUE_IDS, None, None));
    }

    #[test]
    fn decodes_kernel_calls_evictions_and_process_lifetime() {
        use gpreempt_common::record::{CallPhase, KfdCallRecord, KfdFn, ProcessCreateRecord, SmiQueueRecord};
        let call = |function, phase, owner, gpu_id, args, ret| {
            KfdCallRecord::new(header(RecordKind::KfdCall, 3, "kworker/1:2"), function, phase, owner, gpu_id, args, ret)
        };
        let fence = call(KfdFn::FenceWaitTimeout, CallPhase::Return, 0, 0x1234, [9, 9000, 0, 0], -62);
        let EventKind::KfdCall(c) = decode(&bytes_of(&fence)).unwrap().kind else { panic!() };
        assert_eq!(
            (c.function, c.kfd_fn, c.owner_pid, c.gpu_id),
            ("amdkfd_fence_wait_timeout", KfdFn::FenceWaitTimeout, None, Some(GpuId(0x1234)))
        );
        assert_eq!((c.fence_value, c.timeout_ms, c.result.name()), (Some(9), Some(9000), "ETIME".to_owned()));
        let evict = call(KfdFn::ProcessEvictQueues, CallPhase::Return, 42, 0, [2, 0, 0, 0], 0);
        let EventKind::KfdCall(c) = decode(&bytes_of(&evict)).unwrap().kind else { panic!() };
        assert_eq!((c.owner_pid, c.trigger), (Some(HostPid(42)), Some(EvictionTrigger::Ttm)));
        let primary = u64::from(CONTEXT_ID_PRIMARY);
        let removed = call(KfdFn::ProcfsDelQueue, CallPhase::Entry, 42, 0, [7, primary, 0, 0], 0);
        let removal = |context_id| {
            EventKind::QueueRemoved(QueueRemoved {
                owner_pid: Some(HostPid(42)),
                queue_id: Some(QueueId(7)),
                context_id,
            })
        };
        assert_eq!(decode(&bytes_of(&removed)).unwrap().kind, removal(None));
        // The same queue id in secondary context 0 (Linux 7.0) is another queue.
        let removed = call(KfdFn::ProcfsDelQueue, CallPhase::Entry, 42, 0, [7, 0, 0, 0], 0);
        assert_eq!(decode(&bytes_of(&removed)).unwrap().kind, removal(Some(0)));
        // A queue reset alone: its owner (from the qpd), gpu (from the dqm), id and context.
        let reset = call(KfdFn::QueueSetReset, CallPhase::Entry, 42, 0x1001, [1, primary, 0, 0], 0);
        assert_eq!(
            decode(&bytes_of(&reset)).unwrap().kind,
            EventKind::QueueReset(QueueReset {
                owner_pid: Some(HostPid(42)),
                gpu_id: Some(GpuId(0x1001)),
                queue_id: Some(QueueId(1)),
                context_id: None,
            })
        );
        // A secondary context made (Linux 7.0), its id read; a failed CREATE_PROCESS has none.
        let made = call(KfdFn::ContextCreate, CallPhase::Return, 42, 0, [3, 0, 0, 0], 0);
        assert_eq!(
            decode(&bytes_of(&made)).unwrap().kind,
            EventKind::ContextCreate(ContextCreate { context_id: Some(3), result: KernelResult(0), ret: 0 })
        );
        let refused = call(KfdFn::ContextCreate, CallPhase::Return, 42, 0, [u64::from(u32::MAX), 0, 0, 0], -22);
        assert_eq!(
            decode(&bytes_of(&refused)).unwrap().kind,
            EventKind::ContextCreate(ContextCreate { context_id: None, result: KernelResult(-22), ret: -22 })
        );
        let exit = call(KfdFn::ProcessRelease, CallPhase::Entry, 42, 0, [0; 4], 0);
        assert_eq!(
            decode(&bytes_of(&exit)).unwrap().kind,
            EventKind::ProcessExit(ProcessExit { owner_pid: Some(HostPid(42)), stage: "kfd_process_wq_release" })
        );
        let unknown =
            KfdCallRecord { function: 999, ..call(KfdFn::MapQueuesCpsch, CallPhase::Return, 0, 0, [0; 4], 0) };
        assert_eq!(decode(&bytes_of(&unknown)), Err(DecodeError::UnknownFunction(999)));
        let bad_phase = KfdCallRecord { phase: 2, ..unknown };
        assert_eq!(decode(&bytes_of(&KfdCallRecord { function: 7, ..bad_phase })), Err(DecodeError::UnknownPhase(2)));
        let entry_of_return_only = call(KfdFn::MapQueuesCpsch, CallPhase::Entry, 0, 0, [0; 4], 0);
        assert_eq!(decode(&bytes_of(&entry_of_return_only)), Err(DecodeError::UnknownFunction(7)));

        let smi = SmiQueueRecord {
            header: header(RecordKind::SmiQueue, 3, "kworker"),
            pid: 42,
            trigger: 2,
            gpu_id: 0,
            restore: 0,
        };
        assert_eq!(
            decode(&bytes_of(&smi)).unwrap().kind,
            EventKind::QueueEviction(QueueEviction {
                target_pid: HostPid(42),
                gpu_id: None,
                trigger: EvictionTrigger::Ttm
            })
        );
        let restore = SmiQueueRecord { restore: 1, gpu_id: 5, ..smi };
        assert_eq!(
            decode(&bytes_of(&restore)).unwrap().kind,
            EventKind::QueueRestore(QueueRestore { target_pid: HostPid(42), gpu_id: Some(GpuId(5)) })
        );
        let open = ProcessCreateRecord {
            header: header(RecordKind::ProcessCreate, 42, "x"),
            process: 0xffff_8880_0000_1000,
            tgid: 42,
            from_task: 1,
        };
        assert_eq!(
            decode(&bytes_of(&open)).unwrap().kind,
            EventKind::ProcessOpen(ProcessOpen { owner_pid: HostPid(42), kfd_process: 0xffff_8880_0000_1000 })
        );
    }

    #[test]
    fn every_kind_rejects_a_short_record() {
        for kind in 1..=9u32 {
            let mut h = header(RecordKind::QueueCreate, 1, "x");
            h.kind = kind;
            let err = decode(&bytes_of(&h)).unwrap_err();
            assert!(matches!(err, DecodeError::Short { len: 48, .. }), "kind {kind}: {err}");
        }
    }
}
