//! Processes and queues that appear or go while the scheduler runs. With the tracer, from its
//! records (process open/teardown, CREATE_QUEUE with the queue's index addresses, destroy);
//! without it, from the KFD sysfs tree (processes only: sysfs has no index addresses). The
//! tracer also gives the driver's side of each suspend and resume (its spans).

use std::{collections::BTreeSet, sync::mpsc};

use crate::{
    domain::{HostPid, QueueId},
    event::{Event, EventKind},
    host::{roots::Roots, sysfs},
    kfd::KfdVersion,
    model::{
        Model,
        spans::{Span, SpanKind},
    },
    pipeline::{Observed, Pipeline},
    schedule::online::QueueAddrs,
    trace::{
        filter::Filter,
        live::{Live, StartError},
        loader,
    },
};

/// One change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    ProcessOpened(HostPid),
    ProcessGone(HostPid),
    QueueCreated { pid: HostPid, addrs: QueueAddrs },
    QueueGone { pid: HostPid, queue_id: QueueId },
}

/// A source of changes, polled by the scheduler's loop without blocking.
pub trait Discovery {
    fn poll(&mut self, out: &mut Vec<Change>);
    /// Whether queue creations (with addresses) are reported.
    fn sees_queues(&self) -> bool;
    /// Whether [`Discovery::driver_spans`] reports the driver's suspends and resumes.
    fn sees_driver(&self) -> bool {
        false
    }
    /// Suspend and resume spans the driver closed since the last call (of every process).
    fn driver_spans(&mut self, _out: &mut Vec<Span>) {}
}

/// What one tracer record means to the scheduler.
pub fn change_of(event: &Event) -> Option<Change> {
    match &event.kind {
        EventKind::ProcessOpen(o) => Some(Change::ProcessOpened(o.owner_pid)),
        EventKind::ProcessExit(x) => x.owner_pid.map(Change::ProcessGone),
        EventKind::QueueCreate(c) if c.result.0 == 0 => c.queue_id.map(|queue_id| Change::QueueCreated {
            pid: event.pid,
            addrs: QueueAddrs { queue_id, gpu_id: c.gpu_id, read: c.read_pointer, write: c.write_pointer },
        }),
        EventKind::QueueDestroy(d) if d.result.0 == 0 => {
            Some(Change::QueueGone { pid: event.pid, queue_id: d.queue_id })
        }
        _ => None,
    }
}

/// The eBPF tracer, in-process. Must be created inside a tokio runtime context (the ring
/// buffer registers with its reactor); it is read without waiting. Every record also goes
/// through the model (the queue map, which names the collateral of a suspend, and the spans).
pub struct TracerDiscovery {
    live: Live,
    /// No sinks: the spans reach [`Discovery::driver_spans`] through the channel subscriber.
    pipeline: Pipeline,
    observed: mpsc::Receiver<Observed>,
}

impl TracerDiscovery {
    /// `version`: the KFD version when the caller already read it.
    pub fn start(version: Option<KfdVersion>, roots: &Roots) -> Result<Self, StartError> {
        let live = Live::start(version, std::path::Path::new(loader::BTF_DIR))?;
        // After the probes are attached, so no queue created meanwhile is missing from the map.
        let mut model = Model::new(Some(roots.clone()));
        model.bootstrap(roots);
        let mut pipeline = Pipeline::new(model, Filter::default());
        let (tx, observed) = mpsc::channel();
        pipeline.subscribe(Box::new(tx));
        Ok(Self { live, pipeline, observed })
    }

    /// Records the tracer could not deliver.
    pub fn dropped(&self) -> u64 {
        self.live.stream.losses().map_or(0, |l| l.dropped())
    }
}

impl Discovery for TracerDiscovery {
    fn poll(&mut self, out: &mut Vec<Change>) {
        let pipeline = &mut self.pipeline;
        self.live.stream.drain(|event| {
            pipeline.deliver(&event);
            out.extend(change_of(&event));
        });
    }

    fn sees_queues(&self) -> bool {
        true
    }

    fn sees_driver(&self) -> bool {
        true
    }

    /// The kretprobe of `suspend_queues`/`resume_queues` submits its record before the ioctl
    /// returns, so after a [`Discovery::poll`] that follows an ioctl its span is here.
    fn driver_spans(&mut self, out: &mut Vec<Span>) {
        out.extend(self.observed.try_iter().filter_map(|o| match o {
            Observed::Span(s) if matches!(s.kind, SpanKind::Suspend | SpanKind::Resume) => Some(s),
            _ => None,
        }));
    }
}

/// The sysfs fallback: the pid list of `/sys/class/kfd/kfd/proc`, compared with the last one.
pub struct SysfsDiscovery {
    roots: Roots,
    known: BTreeSet<u32>,
}

impl SysfsDiscovery {
    pub fn new(roots: Roots) -> Self {
        let known = sysfs::list_pids(&roots.kfd_proc()).unwrap_or_default().into_iter().collect();
        Self { roots, known }
    }
}

impl Discovery for SysfsDiscovery {
    fn poll(&mut self, out: &mut Vec<Change>) {
        let Ok(now) = sysfs::list_pids(&self.roots.kfd_proc()) else { return };
        let now: BTreeSet<u32> = now.into_iter().collect();
        out.extend(now.difference(&self.known).map(|&p| Change::ProcessOpened(HostPid(p))));
        out.extend(self.known.difference(&now).map(|&p| Change::ProcessGone(HostPid(p))));
        self.known = now;
    }

    fn sees_queues(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        domain::GpuId,
        event::{KernelResult, ProcessExit, ProcessOpen, QueueCreate, QueueDestroy},
        model::registry::tests::{create, ev},
    };

    #[test]
    fn records_become_changes_with_the_queue_addresses() {
        let EventKind::QueueCreate(mut c) = create(3, 0x1000) else { unreachable!() };
        c.read_pointer = 0x7f00_0000_2000;
        c.write_pointer = 0x7f00_0000_1000;
        let created = ev(42, 1, EventKind::QueueCreate(c.clone()));
        assert_eq!(
            change_of(&created),
            Some(Change::QueueCreated {
                pid: HostPid(42),
                addrs: QueueAddrs {
                    queue_id: QueueId(3),
                    gpu_id: GpuId(0x1000),
                    read: 0x7f00_0000_2000,
                    write: 0x7f00_0000_1000
                }
            })
        );
        let failed = QueueCreate { result: KernelResult(-22), ret: -22, ..c };
        assert_eq!(change_of(&ev(42, 2, EventKind::QueueCreate(failed))), None);
        let open = ProcessOpen { owner_pid: HostPid(42), kfd_process: 0xffff_8880_0000_0000 };
        assert_eq!(change_of(&ev(1, 3, EventKind::ProcessOpen(open))), Some(Change::ProcessOpened(HostPid(42))));
        let exit = ProcessExit { owner_pid: Some(HostPid(42)), stage: "kfd_process_wq_release" };
        assert_eq!(change_of(&ev(0, 4, EventKind::ProcessExit(exit))), Some(Change::ProcessGone(HostPid(42))));
        let destroy = QueueDestroy { queue_id: QueueId(3), result: KernelResult(0), ret: 0 };
        assert_eq!(
            change_of(&ev(42, 5, EventKind::QueueDestroy(destroy))),
            Some(Change::QueueGone { pid: HostPid(42), queue_id: QueueId(3) })
        );
    }

    #[test]
    fn sysfs_fallback_reports_pids_that_come_and_go() {
        let dir = tempfile::tempdir().unwrap();
        let kfd = dir.path().join("sys/class/kfd/kfd/proc");
        std::fs::create_dir_all(kfd.join("10")).unwrap();
        let roots = Roots { sys: dir.path().join("sys"), ..Roots::default() };
        let mut d = SysfsDiscovery::new(roots);
        let mut out = Vec::new();
        d.poll(&mut out);
        assert_eq!(out, vec![]);
        std::fs::create_dir_all(kfd.join("11")).unwrap();
        std::fs::remove_dir(kfd.join("10")).unwrap();
        d.poll(&mut out);
        assert_eq!(out, vec![Change::ProcessOpened(HostPid(11)), Change::ProcessGone(HostPid(10))]);
        assert!(!d.sees_queues());
    }
}
