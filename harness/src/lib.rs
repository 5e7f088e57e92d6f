//! The native evaluation harness of `gpreempt schedule` (issue 35): the real scheduler, its
//! reaction thread and policy, driven natively against a model GPU and model debug-trap ioctls,
//! with the online and offline loads as separate client processes. PROFILES.md states every cost.

pub mod cgroup;
pub mod client;
pub mod control;
pub mod cpu_phase;
pub mod cpu_wake;
pub mod doorbell_stub;
pub mod engine;
pub mod evaluate;
pub mod fake_roots;
pub mod figures;
pub mod floor;
pub mod gpu;
pub mod http;
pub mod idle_cpu;
pub mod load;
pub mod packet_cost;
pub mod profile;
pub mod publisher;
pub mod request_path;
pub mod rng;
pub mod run;
pub mod scenario;
pub mod sender;
pub mod server;
pub mod shm;
pub mod sink;
pub mod started;
pub mod store_cost;
pub mod suite;
pub mod timer_floor;
pub mod variants;
pub mod wake_floor;
