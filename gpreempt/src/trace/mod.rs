//! The tracer: eBPF probes on the KFD paths of `amdgpu.ko` and the events they produce.
//!
//! [`symbols`] finds the KFD functions in `/proc/kallsyms`, [`probes`] says which program goes on
//! which function, [`loader`] loads and attaches them ([`live`]: with their stream open), [`stream`] reads the ring buffer and
//! [`decode`] turns records into owned [`crate::event::Event`]s (which [`crate::pipeline`] takes
//! through the model, its filter and the output sinks), and [`missed`] asks the kernel for the
//! return probes it skipped.

pub mod btf;
pub mod decode;
pub mod live;
pub mod loader;
pub mod missed;
pub mod probes;
pub mod stream;
pub mod symbols;
