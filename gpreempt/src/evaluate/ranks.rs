//! Is an offline process one rank of a data-parallel job? Holding it through the online-alone
//! state stops its peers at their next collective, on this node and on others, and a hold longer
//! than the job's collective timeout fails the job: evaluate says so before it holds anything.
//!
//! The launchers say it in the ranks' environment: torchrun and DeepSpeed's launcher set
//! `WORLD_SIZE` and `RANK`, Open MPI `OMPI_COMM_WORLD_SIZE` and `OMPI_COMM_WORLD_RANK`, MPICH's
//! Hydra and Slurm's PMI `PMI_SIZE` and `PMI_RANK`. A size above 1 is a job of several ranks.
//! `/proc/PID/environ` is the environment the process started with (evaluate runs as root, which
//! may read it); a job that sets these later is not seen.

use std::time::Duration;

use crate::{domain::HostPid, host::roots::Roots};

/// The (size, rank) variables of each launcher, in the order they are looked for.
const LAUNCHERS: [(&str, &str); 3] =
    [("WORLD_SIZE", "RANK"), ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"), ("PMI_SIZE", "PMI_RANK")];

/// One rank of a job of `size` ranks, as its environment says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rank {
    /// The variable that gave the size (`WORLD_SIZE`).
    pub variable: &'static str,
    pub size: u64,
    /// Its rank, when the environment says.
    pub rank: Option<u64>,
}

/// The rank an environment block (`/proc/PID/environ`: `NAME=value` entries, each ended by a NUL)
/// describes; `None` for a process alone (no size above 1).
pub fn rank_in(environ: &[u8]) -> Option<Rank> {
    let value = |name: &str| {
        environ.split(|&b| b == 0).find_map(|entry| {
            let rest = entry.strip_prefix(name.as_bytes())?.strip_prefix(b"=")?;
            std::str::from_utf8(rest).ok()?.trim().parse::<u64>().ok()
        })
    };
    LAUNCHERS.iter().find_map(|&(size, rank)| {
        let n = value(size).filter(|&n| n > 1)?;
        Some(Rank { variable: size, size: n, rank: value(rank) })
    })
}

/// `pid`'s rank, from its environment under `roots`; `None` when it is alone or unreadable.
pub fn rank_of(roots: &Roots, pid: HostPid) -> Option<Rank> {
    std::fs::read(roots.proc.join(pid.0.to_string()).join("environ")).ok().as_deref().and_then(rank_in)
}

/// The warning said before anything is held.
pub fn warning(pid: HostPid, r: &Rank, state_timeout: Duration) -> String {
    let which = r.rank.map_or_else(|| "a rank".to_owned(), |n| format!("rank {n}"));
    format!(
        "warning: offline pid {pid} is {which} of a data-parallel job of {} ({}={} in its environment): holding it \
         through online alone (up to --state-timeout, {} s) stops its peers at their next collective, and a hold \
         longer than the job's collective timeout fails the job; keep --state-timeout below that timeout, or \
         evaluate with a job that runs on this node alone",
        r.size,
        r.variable,
        r.size,
        state_timeout.as_secs()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launchers_environment_names_the_rank_and_the_jobs_size() {
        assert_eq!(
            rank_in(b"PATH=/usr/bin\0LOCAL_RANK=1\0RANK=3\0WORLD_SIZE=8\0"),
            Some(Rank { variable: "WORLD_SIZE", size: 8, rank: Some(3) })
        );
        assert_eq!(
            rank_in(b"OMPI_COMM_WORLD_SIZE=4\0OMPI_COMM_WORLD_RANK=0\0"),
            Some(Rank { variable: "OMPI_COMM_WORLD_SIZE", size: 4, rank: Some(0) })
        );
        assert_eq!(rank_in(b"PMI_SIZE=2\0"), Some(Rank { variable: "PMI_SIZE", size: 2, rank: None }));
        // One rank alone, no launcher, a name that only ends like one, a value that is no number.
        assert_eq!(rank_in(b"WORLD_SIZE=1\0RANK=0\0"), None);
        assert_eq!(rank_in(b"PATH=/usr/bin\0"), None);
        assert_eq!(rank_in(b"MY_WORLD_SIZE=8\0"), None);
        assert_eq!(rank_in(b"WORLD_SIZE=eight\0"), None);
        assert_eq!(
            warning(HostPid(4242), &Rank { variable: "WORLD_SIZE", size: 8, rank: Some(3) }, Duration::from_secs(600)),
            "warning: offline pid 4242 is rank 3 of a data-parallel job of 8 (WORLD_SIZE=8 in its environment): \
             holding it through online alone (up to --state-timeout, 600 s) stops its peers at their next \
             collective, and a hold longer than the job's collective timeout fails the job; keep --state-timeout \
             below that timeout, or evaluate with a job that runs on this node alone"
        );
    }

    #[test]
    fn a_process_environment_is_read_under_the_roots() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("proc/77")).unwrap();
        std::fs::write(dir.path().join("proc/77/environ"), b"RANK=1\0WORLD_SIZE=2\0").unwrap();
        let roots = Roots { proc: dir.path().join("proc"), ..Roots::default() };
        assert_eq!(rank_of(&roots, HostPid(77)), Some(Rank { variable: "WORLD_SIZE", size: 2, rank: Some(1) }));
        assert_eq!(rank_of(&roots, HostPid(78)), None);
    }
}
