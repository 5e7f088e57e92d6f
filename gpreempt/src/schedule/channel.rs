//! Discovery fed by a tracer that runs elsewhere: `gpreempt agent` already reads the tracer's
//! records on its tokio loop and hands each scheduler thread the model's lifecycle notices over a
//! channel, so a policy needs no tracer of its own (a second attach of every probe, a second
//! ring buffer) and no tokio context on its thread.

use std::sync::mpsc::{Receiver, Sender, channel};

use super::discover::Discovery;
use crate::model::ModelNotice;

/// The receiving end, polled by the scheduler's loop without blocking.
pub struct ChannelDiscovery {
    changes: Receiver<ModelNotice>,
}

/// A sender for the tracer's side and the [`ChannelDiscovery`] for the scheduler's.
pub fn pair() -> (Sender<ModelNotice>, ChannelDiscovery) {
    let (tx, changes) = channel();
    (tx, ChannelDiscovery { changes })
}

impl Discovery for ChannelDiscovery {
    fn poll(&mut self, out: &mut Vec<ModelNotice>) {
        out.extend(self.changes.try_iter());
    }

    /// The sender forwards the model's queue creations, with their index addresses.
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
        tx.send(ModelNotice::ProcessOpened { pid: HostPid(7) }).unwrap();
        tx.send(ModelNotice::ProcessGone { pid: HostPid(7) }).unwrap();
        d.poll(&mut out);
        assert_eq!(
            out,
            vec![ModelNotice::ProcessOpened { pid: HostPid(7) }, ModelNotice::ProcessGone { pid: HostPid(7) }]
        );
        drop(tx);
        d.poll(&mut out);
        assert_eq!(out.len(), 2, "a closed sender is no change");
    }
}
