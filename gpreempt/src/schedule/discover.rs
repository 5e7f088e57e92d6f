//! Processes and queues that appear or go while the scheduler runs, as the model's
//! [`ModelNotice`]s. With the in-process tracer, the model derives them from its records (process
//! open/teardown, CREATE_QUEUE with the queue's index addresses, destroy); without it, they come
//! from the KFD sysfs tree (processes only: sysfs has no index addresses). The tracer also gives
//! the driver's side of each suspend and resume (its spans).

use std::collections::BTreeSet;

use crate::{
    domain::HostPid,
    host::{roots::Roots, sysfs},
    model::{
        ModelNotice,
        spans::{Span, SpanKind},
    },
    pipeline::{
        Observed,
        in_process::{InProcessTracer, TracerOptions},
    },
    trace::live::StartError,
};

/// A source of the model's lifecycle notices, polled by the scheduler's loop without blocking.
pub trait Discovery {
    fn poll(&mut self, out: &mut Vec<ModelNotice>);
    /// Whether queue creations (with addresses) are reported.
    fn sees_queues(&self) -> bool;
    /// Whether [`Discovery::driver_spans`] reports the driver's suspends and resumes.
    fn sees_driver(&self) -> bool {
        false
    }
    /// Suspend and resume spans the driver closed since the last call (of every process).
    fn driver_spans(&mut self, _out: &mut Vec<Span>) {}
}

/// The in-process tracer: the model's notices (queue creations with their index addresses) and
/// the driver's spans of every suspend and resume.
pub struct TracerDiscovery {
    tracer: InProcessTracer,
    /// Spans taken from the tracer with the notices, until [`Discovery::driver_spans`].
    spans: Vec<Span>,
}

impl TracerDiscovery {
    pub fn start(options: &TracerOptions) -> Result<Self, StartError> {
        Ok(Self { tracer: InProcessTracer::start(options)?, spans: Vec::new() })
    }

    /// Records the tracer could not deliver.
    pub fn dropped(&self) -> u64 {
        self.tracer.losses().map_or(0, |l| l.dropped())
    }
}

impl Discovery for TracerDiscovery {
    fn poll(&mut self, out: &mut Vec<ModelNotice>) {
        self.tracer.drain(|_| {});
        for o in self.tracer.observed() {
            match o {
                Observed::Notice(n) => out.push(n),
                Observed::Span(s) if matches!(s.kind, SpanKind::Suspend | SpanKind::Resume) => self.spans.push(s),
                _ => {}
            }
        }
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
        out.append(&mut self.spans);
    }
}

/// The sysfs fallback: the pid list of `/sys/class/kfd/kfd/proc`, compared with the last one.
pub struct SysfsDiscovery {
    roots: Roots,
    known: BTreeSet<HostPid>,
}

impl SysfsDiscovery {
    pub fn new(roots: Roots) -> Self {
        let known = sysfs::list_pids(&roots.kfd_proc()).unwrap_or_default().into_iter().collect();
        Self { roots, known }
    }
}

impl Discovery for SysfsDiscovery {
    fn poll(&mut self, out: &mut Vec<ModelNotice>) {
        let Ok(now) = sysfs::list_pids(&self.roots.kfd_proc()) else { return };
        let now: BTreeSet<HostPid> = now.into_iter().collect();
        out.extend(now.difference(&self.known).map(|&pid| ModelNotice::ProcessOpened { pid }));
        out.extend(self.known.difference(&now).map(|&pid| ModelNotice::ProcessGone { pid }));
        self.known = now;
    }

    fn sees_queues(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            out,
            vec![ModelNotice::ProcessOpened { pid: HostPid(11) }, ModelNotice::ProcessGone { pid: HostPid(10) }]
        );
        assert!(!d.sees_queues());
    }
}
