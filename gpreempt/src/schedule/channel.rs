//! Discovery fed by a tracer that runs elsewhere: `gpreempt agent` already reads the tracer's
//! records on its tokio loop and hands each scheduler thread the changes ([`change_of`]) over a
//! channel, so a policy needs no tracer of its own (a second attach of every probe, a second
//! ring buffer) and no tokio context on its thread.
//!
//! [`change_of`]: super::discover::change_of

use std::sync::mpsc::{Receiver, Sender, channel};

use super::discover::{Change, Discovery};

/// The receiving end, polled by the scheduler's loop without blocking.
pub struct ChannelDiscovery {
    changes: Receiver<Change>,
}

/// A sender for the tracer's side and the [`ChannelDiscovery`] for the scheduler's.
pub fn pair() -> (Sender<Change>, ChannelDiscovery) {
    let (tx, changes) = channel();
    (tx, ChannelDiscovery { changes })
}

impl Discovery for ChannelDiscovery {
    fn poll(&mut self, out: &mut Vec<Change>) {
        out.extend(self.changes.try_iter());
    }

    /// The sender forwards the tracer's CREATE_QUEUE records, with their index addresses.
    fn sees_queues(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::HostPid;

    #[test]
    fn changes_sent_are_polled_in_order_without_blocking() {
        let (tx, mut d) = pair();
        let mut out = Vec::new();
        d.poll(&mut out);
        assert_eq!(out, vec![]);
        tx.send(Change::ProcessOpened(HostPid(7))).unwrap();
        tx.send(Change::ProcessGone(HostPid(7))).unwrap();
        d.poll(&mut out);
        assert_eq!(out, vec![Change::ProcessOpened(HostPid(7)), Change::ProcessGone(HostPid(7))]);
        drop(tx);
        d.poll(&mut out);
        assert_eq!(out.len(), 2, "a closed sender is no change");
    }
}
