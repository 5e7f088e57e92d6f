//! The native evaluation harness of `gpreempt schedule` (issue 35): the real scheduler, its
//! reaction thread and policy, driven natively against a model GPU and model debug-trap ioctls,
//! with the online and offline loads as separate client processes. PROFILES.md states every cost.

pub mod profile;
pub mod rng;
pub mod gpu;
pub mod client;
pub mod control;
pub mod load;
pub mod shm;
