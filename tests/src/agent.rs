//! `gpreempt agent` run by a test, on a free loopback port (`--metrics-addr 127.0.0.1:0`) with
//! the host name `vm`.

use std::{path::Path, process::Command, time::Duration};

use anyhow::Result;

use crate::{binary, daemon::Daemon};

/// `gpreempt agent` with `--config CONFIG` if given, as a [`Daemon`] named `agent`.
pub fn spawn(config: Option<&Path>) -> Result<Daemon> {
    let mut command = Command::new(binary("gpreempt")?);
    command.args(["agent", "--metrics-addr", "127.0.0.1:0", "--hostname", "vm"]);
    if let Some(config) = config {
        command.arg("--config").arg(config);
    }
    Daemon::spawn("agent", &mut command)
}

/// `gpreempt agent --config CONFIG`, and its `msg=started` line.
pub fn start(config: &Path) -> Result<(Daemon, String)> {
    let mut agent = spawn(Some(config))?;
    // Loading every program in a TCG guest on a loaded host has taken over a minute.
    let started = agent.wait_line("msg=started", Duration::from_secs(240))?;
    Ok((agent, started))
}
