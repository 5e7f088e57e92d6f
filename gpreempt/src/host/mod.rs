//! What the host says, read from its files: `/proc` ([`procinfo`]), the KFD sysfs tree
//! ([`sysfs`], the GPU topology [`topology`] and its packages' partitions [`partition`]) and
//! debugfs ([`debugfs`]), container runtimes and Kubernetes ([`k8s`]), where each lives
//! ([`roots`]), the KFD processes seen there ([`processes`]) and the selectors that name them
//! ([`select`]), a process's listening TCP ports ([`sockets`]) and cgroup v2 directory
//! ([`cgroup`]). Below both halves: the tracer, the model and the controller read the host
//! through here; nothing here knows about them.

pub mod cgroup;
pub mod cri;
pub mod debugfs;
pub mod k8s;
pub mod kernel_queue_type;
pub mod partition;
pub mod pod_label;
pub mod processes;
pub mod procinfo;
pub mod roots;
pub mod select;
pub mod sockets;
pub mod sysfs;
pub mod topology;
