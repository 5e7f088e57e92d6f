//! The one in-process tracer: the probe table attached, its ring buffer open, and every record
//! taken through one [`Pipeline`] whose model was bootstrapped from sysfs *after* the probes
//! attached (so no queue created in between is missing from the map). `gpreempt preempt`,
//! `queues --watch`, `schedule` and the agent all start it here; what each needs of the stream —
//! the model's lifecycle notices, the closed spans, or the raw events — comes out of it.

use std::{path::Path, sync::mpsc};

use super::{Observed, Pipeline, filter::Filter};
use crate::{
    event::{Event, Losses},
    host::roots::Roots,
    kfd::KfdVersion,
    model::{Limits, Model},
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
