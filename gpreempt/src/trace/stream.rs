//! Reading the `EVENTS` ring buffer asynchronously and accounting for every lost record.

use aya::maps::{MapData, PerCpuArray, RingBuf};
use gpreempt_common::record::{COUNTERS_MAP, EVENTS_MAP, counter};

use crate::event::{Event, Losses};
use tokio::io::unix::AsyncFd;

use super::{decode, loader::AttachedProbes, missed::ReturnProbeLinks};

#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("map {0} missing from the eBPF object")]
    MissingMap(&'static str),
    #[error("map {name}: {cause}")]
    Map { name: &'static str, cause: aya::maps::MapError },
    #[error("polling the ring buffer: {0}")]
    Poll(#[from] std::io::Error),
}

/// How long the reader leaves the ring buffer alone after a batch. The kernel wakes the reader
/// only for a record written while it is caught up (`bpf_ringbuf_commit()`, kernel/bpf/ringbuf.c,
/// 6.1-6.12: wakeup iff the consumer position equals the record's), so while we pause the first
/// record costs one wakeup and the rest of the window's records none: one wakeup, one read pass
/// and one write(2) per window instead of per event. 2 ms is invisible on a console and holds
/// ~30k records of slack at 15M events/s in the 4 MiB ring.
pub const BATCH_WINDOW: std::time::Duration = std::time::Duration::from_millis(2);

/// The event stream of an attached tracer.
pub struct EventStream {
    ring: AsyncFd<RingBuf<MapData>>,
    counters: PerCpuArray<MapData, u64>,
    return_links: ReturnProbeLinks,
    decode_errors: u64,
    /// No read before this (the end of the last batch plus [`BATCH_WINDOW`]).
    quiet_until: Option<tokio::time::Instant>,
}

impl EventStream {
    /// Takes the maps and the return probes' links out of `attached` (the programs stay attached
    /// while `attached` lives).
    pub fn new(attached: &mut AttachedProbes) -> Result<Self, StreamError> {
        let map =
            |name: &'static str, a: &mut AttachedProbes| a.ebpf.take_map(name).ok_or(StreamError::MissingMap(name));
        let ring = RingBuf::try_from(map(EVENTS_MAP, attached)?)
            .map_err(|source| StreamError::Map { name: EVENTS_MAP, cause: source })?;
        let counters = PerCpuArray::try_from(map(COUNTERS_MAP, attached)?)
            .map_err(|source| StreamError::Map { name: COUNTERS_MAP, cause: source })?;
        // SAFETY: the ring buffer map owns its fd for as long as the AsyncFd owns the map.
        let ring = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
            .map_err(std::io::Error::from)?;
        let return_links = std::mem::take(&mut attached.return_links);
        Ok(Self { ring, counters, return_links, decode_errors: 0, quiet_until: None })
    }

    /// Wait until records are available (and the batch window since the last batch has passed),
    /// then hand every available event to `sink`. Cancel-safe: dropping the future loses nothing.
    pub async fn next_batch(&mut self, mut sink: impl FnMut(Event)) -> Result<usize, StreamError> {
        if let Some(at) = self.quiet_until {
            tokio::time::sleep_until(at).await;
        }
        let mut guard = self.ring.readable_mut().await?;
        let n = drain(guard.get_inner_mut(), &mut self.decode_errors, &mut sink);
        guard.clear_ready();
        self.quiet_until = Some(tokio::time::Instant::now() + BATCH_WINDOW);
        Ok(n)
    }

    /// Hand every record already in the ring buffer to `sink` without waiting.
    pub fn drain(&mut self, mut sink: impl FnMut(Event)) -> usize {
        drain(self.ring.get_mut(), &mut self.decode_errors, &mut sink)
    }

    pub fn losses(&self) -> Result<Losses, StreamError> {
        let sum = |index: u32| -> Result<u64, StreamError> {
            let values = self
                .counters
                .get(&index, 0)
                .map_err(|source| StreamError::Map { name: COUNTERS_MAP, cause: source })?;
            Ok(values.iter().sum())
        };
        Ok(Losses {
            ringbuf_full: sum(counter::RINGBUF_FULL)?,
            read_failed: sum(counter::READ_FAILED)?,
            entry_missing: sum(counter::ENTRY_MISSING)?,
            decode_errors: self.decode_errors,
            return_probes_missed: self.return_links.missed(),
            owner_unknown: sum(counter::OWNER_UNKNOWN)?,
        })
    }
}

fn drain(ring: &mut RingBuf<MapData>, decode_errors: &mut u64, sink: &mut impl FnMut(Event)) -> usize {
    let mut n = 0;
    while let Some(item) = ring.next() {
        match decode::decode(&item) {
            Ok(event) => {
                n += 1;
                sink(event);
            }
            Err(e) => {
                *decode_errors += 1;
                log::warn!("undecodable record: {e}");
            }
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missed_return_probes_count_as_dropped_and_are_printed() {
        let mut l = Losses { ringbuf_full: 1, decode_errors: 2, return_probes_missed: Some(6), ..Default::default() };
        assert_eq!(l.dropped(), 9);
        assert_eq!(
            l.to_string(),
            "ring buffer full 1, probe read failed 0, return without entry 0, undecodable 2, return probes missed 6"
        );
        l.return_probes_missed = None;
        assert_eq!(l.dropped(), 3);
        assert!(l.to_string().ends_with("return probes missed unknown (before Linux 6.7)"), "{l}");
        let json = serde_json::to_value(l).unwrap();
        assert!(json.as_object().unwrap().contains_key("return_probes_missed"), "{json}");
        assert_eq!(json["return_probes_missed"], serde_json::Value::Null);
    }
}
