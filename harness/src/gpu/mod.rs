//! The model GPU: [`core::GpuCore`] (pure) and its real-time driver.

pub mod core;
