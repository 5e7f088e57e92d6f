//! The one in-process tracer: the probe table attached, its ring buffer open, and every record
//! taken through one [`Pipeline`] whose model was bootstrapped from sysfs *after* the probes
//! attached (so no queue created in between is missing from the map). `gpreempt trace`,
//! `preempt`, `queues --watch`, `top`, `schedule` (and `evaluate`, through the scheduler's
//! discovery) and the agent all start it here; what each needs of the stream —
//! the model's lifecycle notices, the closed spans, or the raw events — comes out of it.
//! [`DrainingTracer`] is the same tracer on a thread of its own (`preempt`).

use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread::{Scope, ScopedJoinHandle},
    time::Duration,
};

use super::{Observed, Pipeline, filter::Filter};
use crate::{
    domain::HostPid,
    event::{Event, Losses},
    host::roots::Roots,
    kfd::KfdVersion,
    model::{Limits, Model, ModelNotice, spans::Span},
    trace::{
        live::{Live, StartError},
        loader::{AttachedProbes, BTF_DIR},
        stream::StreamError,
    },
};

/// How to start an [`InProcessTracer`].
#[derive(Clone, Debug)]
pub struct TracerOptions {
    /// The KFD version when the caller already read it (the probe table's minimums); `None`
    /// reads it.
    pub version: Option<KfdVersion>,
    /// Where the kernel's BTF is read (vmlinux and module BTF).
    pub btf_dir: std::path::PathBuf,
    pub roots: Roots,
    /// How long exited processes stay in the model.
    pub limits: Limits,
    /// What the pipeline's sinks show (the model sees everything).
    pub filter: Filter,
    /// Keep the model's notices and spans for [`InProcessTracer::observed`]. A caller that never
    /// reads them (`gpreempt trace`, whose sinks show them) leaves this off, or they pile up.
    pub observe: bool,
}

impl Default for TracerOptions {
    fn default() -> Self {
        Self {
            version: None,
            btf_dir: Path::new(BTF_DIR).to_path_buf(),
            roots: Roots::default(),
            limits: Limits::default(),
            filter: Filter::default(),
            observe: true,
        }
    }
}

/// The probes (attached while this lives), their stream, and the pipeline every record goes
/// through. Must be created inside a tokio runtime context (the ring buffer registers with its
/// reactor); [`InProcessTracer::drain`] reads it without waiting, from any thread of that
/// process.
pub struct InProcessTracer {
    live: Live,
    pipeline: Pipeline,
    /// The pipeline's own subscriber: notices, spans and forgotten pids, in stream order (with
    /// [`TracerOptions::observe`]).
    observed: Option<mpsc::Receiver<Observed>>,
    bootstrap_notes: Vec<String>,
}

impl InProcessTracer {
    pub fn start(options: &TracerOptions) -> Result<Self, StartError> {
        let live = Live::start(options.version, &options.btf_dir)?;
        // After the probes are attached, so no queue created meanwhile is missing from the map.
        let mut model = Model::new(Some(options.roots.clone())).with_limits(options.limits);
        let bootstrap_notes = model.bootstrap(&options.roots);
        let mut pipeline = Pipeline::new(model, options.filter.clone());
        let observed = options.observe.then(|| {
            let (tx, observed) = mpsc::channel();
            pipeline.subscribe(Box::new(tx));
            observed
        });
        Ok(Self { live, pipeline, observed, bootstrap_notes })
    }

    /// What attaching found (probes, module, offsets).
    pub fn probes(&self) -> &AttachedProbes {
        &self.live.attached
    }

    /// Probes attached, and probes of the table this kernel lacks.
    pub fn probe_counts(&self) -> (usize, usize) {
        self.live.probe_counts()
    }

    /// What the model's bootstrap scan noted (unreadable entries), once.
    pub fn take_bootstrap_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.bootstrap_notes)
    }

    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// For another subscriber (a metrics recorder) or [`Pipeline::expire`].
    pub fn pipeline_mut(&mut self) -> &mut Pipeline {
        &mut self.pipeline
    }

    pub fn model(&self) -> &Model {
        self.pipeline.model()
    }

    /// Take every record already in the ring buffer through the pipeline (reading its memory,
    /// no system call), handing each event to `each` after the model applied it. Returns how
    /// many.
    pub fn drain(&mut self, mut each: impl FnMut(&Event)) -> usize {
        let pipeline = &mut self.pipeline;
        self.live.stream.drain(|event| {
            pipeline.deliver(&event);
            each(&event);
        })
    }

    /// Wait for the next batch of records and take it through the pipeline (the agent's loop).
    pub async fn next_batch(&mut self, mut each: impl FnMut(&Event)) -> Result<usize, StreamError> {
        let pipeline = &mut self.pipeline;
        self.live
            .stream
            .next_batch(|event| {
                pipeline.deliver(&event);
                each(&event);
            })
            .await
    }

    /// What the model said since the last call: lifecycle notices, closed spans and forgotten
    /// processes, in stream order (nothing without [`TracerOptions::observe`]).
    pub fn observed(&self) -> impl Iterator<Item = Observed> + '_ {
        self.observed.iter().flat_map(mpsc::Receiver::try_iter)
    }

    /// Take the pipeline out (to finish its sinks) and detach the probes.
    pub fn into_pipeline(self) -> Pipeline {
        self.pipeline
    }

    /// Records the tracer could not deliver, by cause.
    pub fn losses(&self) -> Result<Losses, StreamError> {
        self.live.stream.losses()
    }
}

/// What a [`DrainingTracer`] kept: the closed spans of the pids it was told to keep, in stream
/// order, and the records it could not deliver.
#[derive(Debug, Default)]
pub struct Drained {
    pub spans: Vec<Span>,
    pub losses: Option<Losses>,
}

/// An [`InProcessTracer`] on a thread of its own that drains the ring buffer every `period`, so
/// no draining happens on the thread that runs the controller's cycles (a drain of many records
/// would lengthen that cycle's hold or gap). It keeps the spans of the pids it is given (more can
/// be added while it runs, before their first suspend) and forwards the processes that open
/// `/dev/kfd`. Every exchange is a channel message: nothing blocks the caller.
pub struct DrainingTracer<'scope> {
    join: ScopedJoinHandle<'scope, Drained>,
    draining: Arc<AtomicBool>,
    keep: mpsc::Sender<HostPid>,
    opened: mpsc::Receiver<HostPid>,
}

impl<'scope> DrainingTracer<'scope> {
    /// Start the tracer on a thread of `scope` and wait until it is attached; why not, when it
    /// cannot attach. Called inside a tokio runtime context (the ring buffer registers with its
    /// reactor; the draining thread only reads the buffer's memory).
    pub fn spawn<'env>(
        scope: &'scope Scope<'scope, 'env>,
        options: TracerOptions,
        keep: Vec<HostPid>,
        period: Duration,
    ) -> Result<Self, StartError> {
        let draining = Arc::new(AtomicBool::new(true));
        let (keep_tx, keep_rx) = mpsc::channel::<HostPid>();
        let (opened_tx, opened) = mpsc::channel::<HostPid>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), StartError>>();
        let runtime = tokio::runtime::Handle::try_current().ok();
        let flag = Arc::clone(&draining);
        let join = scope.spawn(move || {
            let _runtime = runtime.as_ref().map(tokio::runtime::Handle::enter);
            let mut tracer = match InProcessTracer::start(&options) {
                Ok(t) => t,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return Drained::default();
                }
            };
            let _ = ready_tx.send(Ok(()));
            let mut kept = keep;
            let mut spans = Vec::new();
            let mut collect = |tracer: &mut InProcessTracer| {
                tracer.drain(|_| {});
                // Read after the drain: a pid is sent before its first suspend, so before any of
                // its spans can be drained.
                kept.extend(keep_rx.try_iter());
                for o in tracer.observed() {
                    match o {
                        Observed::Notice(ModelNotice::ProcessOpened { pid }) => {
                            let _ = opened_tx.send(pid);
                        }
                        Observed::Span(s) if s.target_pid.is_some_and(|p| kept.contains(&p)) => spans.push(s),
                        _ => {}
                    }
                }
            };
            while flag.load(Ordering::Relaxed) {
                collect(&mut tracer);
                std::thread::sleep(period);
            }
            collect(&mut tracer);
            Drained { spans, losses: tracer.losses().ok() }
        });
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Self { join, draining, keep: keep_tx, opened }),
            Ok(Err(e)) => {
                let _ = join.join();
                Err(e)
            }
            // The thread died before it could say (it panicked).
            Err(_) => {
                let _ = join.join();
                Err(StartError::Gone)
            }
        }
    }

    /// Keep the spans of `pid` too (a target added during the run), from its first suspend on.
    pub fn keep(&self, pid: HostPid) {
        let _ = self.keep.send(pid);
    }

    /// Processes the tracer saw opening `/dev/kfd` since the last call.
    pub fn opened(&self, out: &mut Vec<HostPid>) {
        out.extend(self.opened.try_iter());
    }

    /// Stop draining and return what was kept; `None` when the thread failed (it panicked).
    pub fn finish(self) -> Option<Drained> {
        self.draining.store(false, Ordering::Relaxed);
        self.join.join().ok()
    }
}
