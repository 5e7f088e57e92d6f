//! The binary's subcommands: argument handling and output around the library.

pub mod agent;
pub mod analyze;
pub mod doctor;
pub mod evaluate;
pub mod examples;
pub mod generate;
pub mod hw;
pub mod interrupt;
pub mod preempt;
pub mod ps;
pub mod queues;
pub mod schedule;
pub mod stderr;
pub mod stdout;
pub mod top;
pub mod trace;

use anyhow::{Result, bail};
use gpreempt::{
    domain::HostPid,
    host::{roots::Roots, select::Selector},
};

/// The one KFD process `selector` names now, for a flag that takes one process (`queues SEL`,
/// `preempt --online SEL`); `flag` names it in the errors, with the selector as given. A pid is
/// taken as it is (the command checks it).
pub fn one_process(selector: &Selector, roots: &Roots, flag: &str) -> Result<HostPid> {
    if let Selector::Pid(pid) = selector {
        return Ok(*pid);
    }
    let resolved = gpreempt::host::select::resolve(std::slice::from_ref(selector), roots);
    if let Some(message) = resolved.lookup_errors.first() {
        bail!("{flag} {message}");
    }
    match resolved.pids.as_slice() {
        [pid] => Ok(*pid),
        [] => bail!("{flag} {selector}: no KFD process runs there now (see `gpreempt ps` for the KFD processes)"),
        pids => {
            let list: Vec<String> = pids.iter().map(ToString::to_string).collect();
            bail!(
                "{flag} {selector} names {} KFD processes (pids {}); this takes one: give its pid",
                pids.len(),
                list.join(", ")
            )
        }
    }
}
