//! `gpreempt ps`'s table: a line per process and GPU, with its partition, its queues on that GPU
//! (`id:type`, a secondary KFD context's named by its [`QueueKey`]: `context_0/3:compute`, Linux
//! 7.0) and its per-GPU sysfs figures.

use crate::{
    domain::GpuId,
    host::{partition::Partitions, processes::KfdProcess, procinfo},
    model::registry::QueueKey,
    output::text::escape,
};

/// `runtime:name` (or `runtime:short-id`); for a Kubernetes pod's container
/// `namespace/pod/container`, as the runtime's record names them.
pub fn container_label(p: &KfdProcess) -> String {
    if let Some(pod) = &p.pod {
        let container = p.container_name.as_deref().unwrap_or("?");
        return escape(&format!("{}/{}/{container}", pod.namespace, pod.name)).into_owned();
    }
    match p.info.as_ref().and_then(|i| i.container.as_ref()) {
        None => "-".to_owned(),
        Some(c) => match &c.name {
            Some(name) => format!("{}:{}", c.runtime, escape(name)),
            None => format!("{}:{}", c.runtime, procinfo::short_id(&c.id)),
        },
    }
}

/// The text table of `processes`: a header, then a line per process and GPU (one with `-` for a
/// process on no GPU). A queue is `label:type`, its label the one every view gives it.
pub fn table(processes: &[KfdProcess], partitions: &Partitions) -> Vec<String> {
    let mut lines = vec![format!(
        "{:>8} {:>7} {:<24} {:<16} {:>8} {:<20} {:<28} {:>10} {:>9} {:>4}",
        "PID", "NSPID", "CONTAINER", "COMM", "GPU", "PARTITION", "QUEUES (id:type)", "VRAM MiB", "EVICT ms", "CU"
    )];
    for p in processes {
        let comm = escape(p.info.as_ref().and_then(|i| i.comm.as_deref()).unwrap_or("?"));
        let ns_pid = p.info.as_ref().and_then(|i| i.ns_pid).map_or_else(|| "?".to_owned(), |n| n.to_string());
        let gpus: Vec<GpuId> = {
            let mut g: Vec<GpuId> = p.sysfs.gpus.iter().map(|g| g.gpu_id).collect();
            g.extend(p.sysfs.queues.iter().filter_map(|q| q.gpu_id));
            g.sort_unstable();
            g.dedup();
            g
        };
        if gpus.is_empty() {
            lines.push(format!("{:>8} {ns_pid:>7} {:<24} {comm:<16} {:>8}", p.pid(), container_label(p), "-"));
        }
        for gpu in gpus {
            let queues: Vec<String> = p
                .sysfs
                .queues
                .iter()
                .filter(|q| q.gpu_id == Some(gpu))
                .map(|q| format!("{}:{}", QueueKey { context: q.context, queue_id: q.queue_id }, q.type_name()))
                .collect();
            let stats = p.sysfs.gpus.iter().find(|g| g.gpu_id == gpu);
            let opt = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
            lines.push(format!(
                "{:>8} {ns_pid:>7} {:<24} {comm:<16} {:>8} {:<20} {:<28} {:>10} {:>9} {:>4}",
                p.pid(),
                container_label(p),
                format!("{gpu:#x}"),
                partitions.label(gpu),
                if queues.is_empty() { "-".to_owned() } else { queues.join(" ") },
                opt(stats.and_then(|s| s.vram_bytes).map(|b| format!("{:.1}", b as f64 / 1048576.0))),
                opt(stats.and_then(|s| s.evicted_ms).map(|v| v.to_string())),
                opt(stats.and_then(|s| s.cu_occupancy).map(|v| v.to_string())),
            ));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        domain::{HostPid, QueueId},
        host::{
            procinfo::ProcInfo,
            sysfs::{KfdContext, SysfsGpu, SysfsProcess, SysfsQueue},
        },
    };

    /// Linux 7.0: queue 0 of the primary context and queue 0 of secondary context 0 are two
    /// queues; the table names the secondary's by its context, as `top` and `queues` do.
    #[test]
    fn a_secondary_context_s_queues_are_labelled_by_their_context() {
        let queue = |context, id, kernel_type| SysfsQueue {
            context,
            queue_id: QueueId(id),
            gpu_id: Some(GpuId(0x1000)),
            kernel_type: Some(kernel_type),
            ring_size: Some(4096),
        };
        let gpu = SysfsGpu {
            gpu_id: GpuId(0x1000),
            vram_bytes: Some(64 << 20),
            sdma_us: None,
            evicted_ms: Some(0),
            cu_occupancy: None,
            partition: None,
        };
        let process = |pid, queues| KfdProcess {
            sysfs: SysfsProcess { pid: HostPid(pid), pasid: None, queues, gpus: vec![gpu.clone()], notes: vec![] },
            info: Some(ProcInfo {
                pid: HostPid(pid),
                comm: Some("worker".to_owned()),
                ns_pid: Some(pid),
                container: None,
            }),
            pod: None,
            container_name: None,
        };
        let processes = [
            process(
                4242,
                vec![
                    queue(KfdContext::Primary, 0, 0),
                    queue(KfdContext::Primary, 1, 1),
                    queue(KfdContext::Secondary(0), 0, 0),
                ],
            ),
            process(4243, vec![]),
        ];
        assert_eq!(
            table(&processes, &Partitions::default()),
            [
                "     PID   NSPID CONTAINER                COMM                  GPU PARTITION            \
                 QUEUES (id:type)               VRAM MiB  EVICT ms   CU",
                "    4242    4242 -                        worker             0x1000 -                    \
                 0:compute 1:sdma context_0/0:compute       64.0         0    -",
                "    4243    4243 -                        worker             0x1000 -                    \
                 -                                  64.0         0    -",
            ]
        );
    }
}
