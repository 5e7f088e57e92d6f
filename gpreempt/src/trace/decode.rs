//! Ring-buffer records → owned [`Event`]s.
//!
//! Records are read with unaligned copies after a length check; a short record or an unknown
//! kind is a [`DecodeError`] the stream counts, never a panic.

use std::mem::size_of;

use gpreempt_common::{
    kfd_uapi::queue_type,
    record::{QueueCreateRecord, QueueDestroyRecord, RecordHeader, RecordKind},
};
use serde::Serialize;

/// One traced occurrence, owned and decoded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Event {
    /// CLOCK_BOOTTIME ns when the record was written.
    pub ts_ns: u64,
    /// CLOCK_BOOTTIME ns when the traced function was entered.
    pub entry_ns: u64,
    pub cpu: u32,
    /// Host pid (thread group id) of the calling task.
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    #[serde(flatten)]
    pub kind: EventKind,
}

impl Event {
    /// Time spent inside the traced function.
    pub fn duration_ns(&self) -> u64 {
        self.ts_ns.saturating_sub(self.entry_ns)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EventKind {
    QueueCreate(QueueCreate),
    QueueDestroy(QueueDestroy),
}

impl EventKind {
    pub fn name(&self) -> &'static str {
        match self {
            Self::QueueCreate(_) => "queue_create",
            Self::QueueDestroy(_) => "queue_destroy",
        }
    }
}

/// The return value of a KFD handler: 0 or a negative errno.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelResult(pub i64);

impl KernelResult {
    pub fn is_ok(self) -> bool {
        self.0 >= 0
    }

    /// `OK`, or the errno name (`EINVAL`) for a negative value.
    pub fn name(self) -> String {
        if self.0 >= 0 {
            return "OK".to_owned();
        }
        match i32::try_from(-self.0) {
            Ok(errno) => match nix::errno::Errno::from_raw(errno) {
                nix::errno::Errno::UnknownErrno => format!("E{errno}"),
                known => format!("{known:?}"),
            },
            Err(_) => format!("{}", self.0),
        }
    }
}

impl Serialize for KernelResult {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

/// `kfd_ioctl_create_queue` returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueCreate {
    /// Assigned queue id; only meaningful when the call succeeded.
    pub queue_id: Option<u32>,
    pub gpu_id: u32,
    /// `KFD_IOC_QUEUE_TYPE_*` name (`compute-aql`), or the number when unknown.
    pub queue_type: String,
    pub priority: u32,
    pub percentage: u32,
    pub ring_base: u64,
    pub ring_size: u32,
    pub read_pointer: u64,
    pub write_pointer: u64,
    pub doorbell_offset: Option<u64>,
    pub eop_buffer: u64,
    pub eop_buffer_size: u64,
    pub cwsr_address: u64,
    pub cwsr_size: u32,
    pub ctl_stack_size: u32,
    pub result: KernelResult,
    pub ret: i64,
}

/// `kfd_ioctl_destroy_queue` returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueDestroy {
    pub queue_id: u32,
    pub result: KernelResult,
    pub ret: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("record of {len} bytes is shorter than its {need}-byte {what}")]
    Short { len: usize, need: usize, what: &'static str },
    #[error("unknown record kind {0}")]
    UnknownKind(u32),
}

fn read<T: Copy>(bytes: &[u8], what: &'static str) -> Result<T, DecodeError> {
    let need = size_of::<T>();
    if bytes.len() < need {
        return Err(DecodeError::Short { len: bytes.len(), need, what });
    }
    // SAFETY: length checked; `T` is a plain-old-data record (`aya::Pod` on the user side).
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

fn comm(raw: &[u8]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

/// Decode one ring-buffer record.
pub fn decode(bytes: &[u8]) -> Result<Event, DecodeError> {
    let header: RecordHeader = read(bytes, "header")?;
    let kind = match RecordKind::try_from(header.kind).map_err(DecodeError::UnknownKind)? {
        RecordKind::QueueCreate => {
            let r: QueueCreateRecord = read(bytes, "queue_create record")?;
            let a = r.args;
            let ok = r.ret >= 0;
            EventKind::QueueCreate(QueueCreate {
                queue_id: ok.then_some(a.queue_id),
                gpu_id: a.gpu_id,
                queue_type: queue_type::name(a.queue_type).map_or_else(|| a.queue_type.to_string(), str::to_owned),
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
            let r: QueueDestroyRecord = read(bytes, "queue_destroy record")?;
            EventKind::QueueDestroy(QueueDestroy { queue_id: r.queue_id, result: KernelResult(r.ret), ret: r.ret })
        }
    };
    Ok(Event {
        ts_ns: header.ts_ns,
        entry_ns: header.entry_ns,
        cpu: header.cpu,
        pid: header.tgid,
        tid: header.tid,
        comm: comm(&header.comm),
        kind,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use gpreempt_common::{kfd_uapi::CreateQueueArgs, record::COMM_LEN};

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
            ret: -22,
        };
        let e = decode(&bytes_of(&rec)).unwrap();
        assert_eq!((e.pid, e.tid, e.comm.as_str(), e.cpu), (4242, 4243, "kfd-client", 1));
        assert_eq!(e.duration_ns(), 3_500);
        let EventKind::QueueCreate(c) = e.kind else { panic!("wrong kind") };
        assert_eq!(c.queue_id, None, "a failed create assigns no queue id");
        assert_eq!(c.gpu_id, 0x1234);
        assert_eq!(c.queue_type, "compute-aql");
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
            ret: 0,
        };
        let EventKind::QueueCreate(c) = decode(&bytes_of(&rec)).unwrap().kind else { panic!() };
        assert_eq!((c.queue_id, c.doorbell_offset, c.queue_type.as_str()), (Some(3), Some(0x1000), "9"));
        assert_eq!(c.result.name(), "OK");
        rec.ret = -4095;
        let EventKind::QueueCreate(c) = decode(&bytes_of(&rec)).unwrap().kind else { panic!() };
        assert_eq!(c.result.name(), "E4095");

        let d =
            QueueDestroyRecord { header: header(RecordKind::QueueDestroy, 9, "y"), queue_id: 42, _pad: 0, ret: -22 };
        let e = decode(&bytes_of(&d)).unwrap();
        assert_eq!(e.kind, EventKind::QueueDestroy(QueueDestroy { queue_id: 42, result: KernelResult(-22), ret: -22 }));
    }

    #[test]
    fn short_and_unknown_records_are_errors() {
        assert_eq!(decode(&[0u8; 10]), Err(DecodeError::Short { len: 10, need: 48, what: "header" }));
        let h = header(RecordKind::QueueCreate, 1, "x");
        assert_eq!(decode(&bytes_of(&h)), Err(DecodeError::Short { len: 48, need: 144, what: "queue_create record" }));
        let mut unknown = h;
        unknown.kind = 999;
        assert_eq!(decode(&bytes_of(&unknown)), Err(DecodeError::UnknownKind(999)));
    }

    #[test]
    fn json_field_names_are_stable() {
        let d =
            QueueDestroyRecord { header: header(RecordKind::QueueDestroy, 9, "y"), queue_id: 42, _pad: 0, ret: -22 };
        let json = serde_json::to_value(decode(&bytes_of(&d)).unwrap()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"ts_ns": 4500, "entry_ns": 1000, "cpu": 1, "pid": 9, "tid": 10, "comm": "y",
                "event": "queue_destroy", "queue_id": 42, "result": "EINVAL", "ret": -22})
        );
    }
}
