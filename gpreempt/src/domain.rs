//! Typed KFD values that cross module boundaries: who (host pid), where (GPU), which queue, and
//! the small closed sets the driver numbers (queue type, debug-trap op, eviction trigger), and
//! the scheduler's transition (suspend or resume) that its reports, metrics and `top` share.
//!
//! Every type serialises exactly as the bare number or name it replaces, so JSON output keeps
//! its shape (docs/guide/json.md); the numbers read back from it the same way (`analyze`).

use std::fmt;

use gpreempt_common::kfd_uapi::{dbg_trap_op, queue_type, runtime_state};
use serde::{Deserialize, Serialize, Serializer};

/// A process id in the host's pid namespace (the thread-group id the kernel probes see).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct HostPid(pub u32);

/// KFD's GPU id (`gpu_id` in the ioctls and sysfs topology; a hash, not an index).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GpuId(pub u32);

/// A queue id, unique per process (KFD allocates them per process, from 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct QueueId(pub u32);

macro_rules! number {
    ($($t:ident),*) => {$(
        impl From<u32> for $t {
            fn from(v: u32) -> Self {
                Self(v)
            }
        }
        impl From<$t> for u32 {
            fn from(v: $t) -> u32 {
                v.0
            }
        }
        impl From<$t> for u64 {
            fn from(v: $t) -> u64 {
                u64::from(v.0)
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
        impl fmt::LowerHex for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::LowerHex::fmt(&self.0, f)
            }
        }
    )*};
}
number!(HostPid, GpuId, QueueId);

/// `KFD_IOC_QUEUE_TYPE_*` of the create ioctl; serialised as `compute-aql`, …, or the number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueType {
    Compute,
    Sdma,
    ComputeAql,
    SdmaXgmi,
    /// KFD 1.17+.
    SdmaByEngId,
    Other(u32),
}

impl QueueType {
    pub fn from_raw(raw: u32) -> Self {
        match raw {
            queue_type::COMPUTE => Self::Compute,
            queue_type::SDMA => Self::Sdma,
            queue_type::COMPUTE_AQL => Self::ComputeAql,
            queue_type::SDMA_XGMI => Self::SdmaXgmi,
            queue_type::SDMA_BY_ENG_ID => Self::SdmaByEngId,
            other => Self::Other(other),
        }
    }

    /// `compute-aql`, …; `None` for a value this build does not know.
    pub fn name(self) -> Option<&'static str> {
        queue_type::name(self.raw())
    }

    pub fn raw(self) -> u32 {
        match self {
            Self::Compute => queue_type::COMPUTE,
            Self::Sdma => queue_type::SDMA,
            Self::ComputeAql => queue_type::COMPUTE_AQL,
            Self::SdmaXgmi => queue_type::SDMA_XGMI,
            Self::SdmaByEngId => queue_type::SDMA_BY_ENG_ID,
            Self::Other(n) => n,
        }
    }
}

/// `KFD_IOC_DBG_TRAP_*` of the debug-trap ioctl; serialised as the UAPI name without the prefix,
/// lower case (`suspend_queues`), or the number when unknown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DebugTrapOp(pub u32);

impl DebugTrapOp {
    pub const ENABLE: Self = Self(dbg_trap_op::ENABLE);
    pub const SUSPEND_QUEUES: Self = Self(dbg_trap_op::SUSPEND_QUEUES);
    pub const RESUME_QUEUES: Self = Self(dbg_trap_op::RESUME_QUEUES);
}

impl DebugTrapOp {
    pub const DISABLE: Self = Self(dbg_trap_op::DISABLE);
    pub const GET_QUEUE_SNAPSHOT: Self = Self(dbg_trap_op::GET_QUEUE_SNAPSHOT);

    /// The UAPI name without the `KFD_IOC_DBG_TRAP_` prefix (`SUSPEND_QUEUES`), as error
    /// messages and docs/kfd.md spell it; the number when unknown.
    pub fn uapi_name(self) -> String {
        dbg_trap_op::name(self.0).map_or_else(|| self.0.to_string(), str::to_owned)
    }
}

/// `kfd_runtime_info.runtime_state` (`enum kfd_dbg_runtime_state`, KFD 1.13+): whether the
/// target's ROCm runtime enabled its debug interface (AMDKFD_IOC_RUNTIME_ENABLE). SUSPEND and
/// RESUME need `Enabled`. Serialised as the kernel's number.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RuntimeState {
    #[default]
    Disabled,
    Enabled,
    EnabledBusy,
    EnabledError,
    Other(u32),
}

impl RuntimeState {
    pub fn from_raw(raw: u32) -> Self {
        match raw {
            runtime_state::DISABLED => Self::Disabled,
            runtime_state::ENABLED => Self::Enabled,
            runtime_state::ENABLED_BUSY => Self::EnabledBusy,
            runtime_state::ENABLED_ERROR => Self::EnabledError,
            other => Self::Other(other),
        }
    }

    pub fn raw(self) -> u32 {
        match self {
            Self::Disabled => runtime_state::DISABLED,
            Self::Enabled => runtime_state::ENABLED,
            Self::EnabledBusy => runtime_state::ENABLED_BUSY,
            Self::EnabledError => runtime_state::ENABLED_ERROR,
            Self::Other(n) => n,
        }
    }
}

impl RuntimeState {
    /// How `gpreempt preempt` describes it when attaching.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Disabled => "not enabled (suspends will fail until the target's ROCm runtime starts)",
            Self::Enabled => "enabled",
            Self::EnabledBusy => "enabled-busy",
            Self::EnabledError => "enabled-error",
            Self::Other(_) => "unknown",
        }
    }
}

impl Serialize for RuntimeState {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(self.raw())
    }
}

/// `enum KFD_QUEUE_EVICTION_TRIGGERS` (identical in 6.1, 6.12 and the newest tree).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EvictionTrigger {
    Svm,
    Userptr,
    Ttm,
    Suspend,
    CriuCheckpoint,
    CriuRestore,
    Other(u32),
}

impl EvictionTrigger {
    pub fn from_raw(raw: u32) -> Self {
        match raw {
            0 => Self::Svm,
            1 => Self::Userptr,
            2 => Self::Ttm,
            3 => Self::Suspend,
            4 => Self::CriuCheckpoint,
            5 => Self::CriuRestore,
            other => Self::Other(other),
        }
    }

    /// `svm`, `ttm`, …; `None` for a value this build does not know.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::Svm => "svm",
            Self::Userptr => "userptr",
            Self::Ttm => "ttm",
            Self::Suspend => "suspend",
            Self::CriuCheckpoint => "criu_checkpoint",
            Self::CriuRestore => "criu_restore",
            Self::Other(_) => return None,
        })
    }
}

/// A suspend or a resume of one GPU's offline queues: the one name for a transition from the
/// scheduler's policy to its reports, the agent's metrics (which `top` reads back) and the JSON
/// (`"suspend"`, `"resume"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransitionKind {
    Suspend,
    Resume,
}

impl TransitionKind {
    /// The name used in the output (as serialised).
    pub fn name(self) -> &'static str {
        match self {
            Self::Suspend => "suspend",
            Self::Resume => "resume",
        }
    }

    /// The transition [`TransitionKind::name`] gives `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Suspend, Self::Resume].into_iter().find(|t| t.name() == name)
    }
}

/// A name, or the raw number for values this build does not know; padded like a string.
fn name_or_number(f: &mut fmt::Formatter<'_>, name: Option<&str>, raw: u32) -> fmt::Result {
    match name {
        Some(name) => f.pad(name),
        None => f.pad(&raw.to_string()),
    }
}

impl fmt::Display for QueueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        name_or_number(f, self.name(), self.raw())
    }
}

impl fmt::Display for EvictionTrigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let raw = if let Self::Other(n) = self { *n } else { 0 };
        name_or_number(f, self.name(), raw)
    }
}

impl fmt::Display for DebugTrapOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        name_or_number(f, dbg_trap_op::name(self.0).map(str::to_ascii_lowercase).as_deref(), self.0)
    }
}

// Names as plain strings (no formatting machinery per event: the JSON Lines sink serialises
// every create), the rare unknown value through Display.
impl Serialize for QueueType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.name() {
            Some(name) => s.serialize_str(name),
            None => s.collect_str(self),
        }
    }
}

impl Serialize for EvictionTrigger {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.name() {
            Some(name) => s.serialize_str(name),
            None => s.collect_str(self),
        }
    }
}

impl Serialize for DebugTrapOp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_serialise_as_the_numbers_and_names_they_replace() {
        let json = serde_json::json!({
            "pid": HostPid(42), "gpu": GpuId(0xa1b2), "queue": QueueId(3),
            "aql": QueueType::from_raw(2), "odd": QueueType::from_raw(9),
            "op": DebugTrapOp::SUSPEND_QUEUES, "op_unknown": DebugTrapOp(99),
            "ttm": EvictionTrigger::from_raw(2), "t7": EvictionTrigger::from_raw(7),
        });
        assert_eq!(
            json,
            serde_json::json!({"pid": 42, "gpu": 41394, "queue": 3, "aql": "compute-aql", "odd": "9",
                "op": "suspend_queues", "op_unknown": "99", "ttm": "ttm", "t7": "7"})
        );
        assert_eq!(format!("{:#06x} {:<12}|", GpuId(0x12), QueueType::ComputeAql), "0x0012 compute-aql |");
        assert_eq!(QueueType::from_raw(9).raw(), 9);
        assert_eq!(EvictionTrigger::from_raw(4).to_string(), "criu_checkpoint");
        assert_eq!(DebugTrapOp::SUSPEND_QUEUES.uapi_name(), "SUSPEND_QUEUES");
        assert_eq!(serde_json::json!([RuntimeState::Enabled, RuntimeState::from_raw(7)]), serde_json::json!([1, 7]));
        assert_eq!(RuntimeState::from_raw(3), RuntimeState::EnabledError);
    }
}
