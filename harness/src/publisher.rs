//! Where a served client's work goes (the client's queues in the shared region, seen through
//! [`Publisher`]): what the server's connection threads and the batching engine both publish on,
//! so that neither needs the client, nor each other, to do it.

/// Where a served client publishes its requests' dispatches and sees them complete (the client's
/// queues in the shared region): the client hands itself in, so the server and the engine need
/// nothing of it.
pub(crate) trait Publisher: Sync {
    /// The harness told the client to stop.
    fn stopped(&self) -> bool;
    fn queue_count(&self) -> usize;
    /// Publish `dispatches` on queue `q`: the write index to wait for, and when it was published.
    fn publish(&self, q: usize, dispatches: &[u64]) -> (u64, u64);
    /// Wait until queue `q` completed up to `target` (false: stopped first).
    fn wait_done(&self, q: usize, target: u64) -> bool;
}
