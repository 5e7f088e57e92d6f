//! The kernel's `enum kfd_queue_type`, which sysfs prints in `proc/<pid>/queues/<id>/type` —
//! not the ioctl's `KFD_IOC_QUEUE_TYPE_*` (docs/kfd.md §1, §4.1).
//!
//! Its numbering changed once: "amdkfd: remove DIQ support" (e1b73b64271d, v7.0-rc1) dropped
//! `KFD_QUEUE_TYPE_DIQ` = 3 and the values after it moved down by one, so `SDMA_XGMI` is 4 on
//! 6.1–6.19 and 3 from 7.0. Which numbering a kernel uses is a detection
//! ([`crate::kfd::features::queue_type_numbering`]); this file only names values under one.

use serde::Serialize;

use crate::kfd::features::QueueTypeNumbering;

/// One value of `enum kfd_queue_type` (kfd_priv.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KernelQueueType {
    /// PM4 and AQL compute queues alike (0 on every version).
    Compute,
    /// 1 on every version.
    Sdma,
    /// The driver's own HWS interface queue (2 on every version; never a user queue).
    Hiq,
    /// The old debugger's queue (3 until 6.19; gone in 7.0).
    Diq,
    SdmaXgmi,
    /// SDMA queue on an engine the creator named (KFD 1.17, Linux 6.12).
    SdmaByEngId,
}

impl KernelQueueType {
    /// The value `raw` under `numbering`; None for a value that numbering does not have.
    pub fn decode(raw: u32, numbering: QueueTypeNumbering) -> Option<Self> {
        use QueueTypeNumbering::{WithDiq, WithoutDiq};
        Some(match (raw, numbering) {
            (0, _) => Self::Compute,
            (1, _) => Self::Sdma,
            (2, _) => Self::Hiq,
            (3, WithDiq) => Self::Diq,
            (4, WithDiq) | (3, WithoutDiq) => Self::SdmaXgmi,
            (5, WithDiq) | (4, WithoutDiq) => Self::SdmaByEngId,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Compute => "compute",
            Self::Sdma => "sdma",
            Self::Hiq => "hiq",
            Self::Diq => "diq",
            Self::SdmaXgmi => "sdma-xgmi",
            Self::SdmaByEngId => "sdma-by-eng-id",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 6.12.117's kfd_priv.h: COMPUTE 0, SDMA 1, HIQ 2, DIQ 3, SDMA_XGMI 4, SDMA_BY_ENG_ID 5.
    #[test]
    fn the_6_12_numbering() {
        let names: Vec<Option<&str>> = (0..7)
            .map(|raw| KernelQueueType::decode(raw, QueueTypeNumbering::WithDiq).map(KernelQueueType::name))
            .collect();
        assert_eq!(
            names,
            [Some("compute"), Some("sdma"), Some("hiq"), Some("diq"), Some("sdma-xgmi"), Some("sdma-by-eng-id"), None]
        );
    }

    /// 7.x (DIQ removed): COMPUTE 0, SDMA 1, HIQ 2, SDMA_XGMI 3, SDMA_BY_ENG_ID 4.
    #[test]
    fn the_7_x_numbering() {
        let names: Vec<Option<&str>> = (0..6)
            .map(|raw| KernelQueueType::decode(raw, QueueTypeNumbering::WithoutDiq).map(KernelQueueType::name))
            .collect();
        assert_eq!(
            names,
            [Some("compute"), Some("sdma"), Some("hiq"), Some("sdma-xgmi"), Some("sdma-by-eng-id"), None]
        );
    }
}
