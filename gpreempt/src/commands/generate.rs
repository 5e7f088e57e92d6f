//! `gpreempt completions SHELL` and `gpreempt man DIR` (hidden): the shell completions and the man
//! pages, generated from the same clap definitions that parse the command line, so they cannot
//! drift from it. `cargo xtask dist` runs both on the binary it packages; a user of the bare
//! static binary runs them to install what the Debian package ships (docs/install.md).

use std::{fs, path::Path};

use anyhow::{Context, Result};
use clap::CommandFactory;

use super::stdout::out;
use crate::cli::{Cli, CompletionsArgs, ManArgs};

/// The completion script of `args.shell` on stdout.
pub fn completions(args: &CompletionsArgs) -> Result<()> {
    out!("{}", script(args.shell)?);
    Ok(())
}

fn script(shell: clap_complete::Shell) -> Result<String> {
    let mut cmd = without_hidden(&Cli::command());
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "gpreempt", &mut script);
    String::from_utf8(script).context("the completion script is not UTF-8")
}

/// `cmd` without its hidden subcommands and arguments. clap_complete's scripts offer every one
/// (clap issue 1335): they would complete this generator and the deprecated flags
/// (`--hold-ms`), which `--help` hides. What the scripts read is kept: names, help, the arguments
/// as defined (values, value hints, conflicts among visible ones), the version flag.
fn without_hidden(cmd: &clap::Command) -> clap::Command {
    let mut out = clap::Command::new(leak(cmd.get_name().to_owned()))
        .args(cmd.get_arguments().filter(|a| !a.is_hide_set()).cloned());
    if let Some(about) = cmd.get_about() {
        out = out.about(about.clone());
    }
    if let Some(about) = cmd.get_long_about() {
        out = out.long_about(about.clone());
    }
    if let Some(version) = cmd.get_version() {
        out = out.version(leak(version.to_owned()));
    }
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        out = out.subcommand(without_hidden(sub));
    }
    out
}

/// One roff page per command in `args.dir`: `gpreempt.1`, then `gpreempt-<sub>.1` for every
/// subcommand a user runs (the hidden ones and clap's `help` have none). Prints the files written.
pub fn man(args: &ManArgs) -> Result<()> {
    fs::create_dir_all(&args.dir).with_context(|| format!("cannot create {}", args.dir.display()))?;
    for file in pages(&args.dir)? {
        super::stdout::outln!("{}", file);
    }
    Ok(())
}

fn pages(dir: &Path) -> Result<Vec<String>> {
    let mut cmd = Cli::command();
    // Built once so every subcommand carries the version, the global --log and the generated
    // `help` subcommand, as `--help` shows them.
    cmd.build();
    let mut written = Vec::new();
    let version = cmd.get_version().unwrap_or_default().to_owned();
    let mut write = |name: String, page: clap::Command| -> Result<()> {
        let path = dir.join(format!("{name}.1"));
        let mut roff = Vec::new();
        clap_mangen::Man::new(page)
            .title(name.to_uppercase())
            .source(format!("gpreempt {version}"))
            .render(&mut roff)?;
        fs::write(&path, roff).with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path.display().to_string());
        Ok(())
    };
    // The top page lists the subcommands, each as its page: clap's `help` has none.
    write("gpreempt".to_owned(), Cli::command().disable_help_subcommand(true))?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        let name = format!("gpreempt-{}", sub.get_name());
        // `gpreempt-doctor(1)`: the page's NAME and SYNOPSIS say the command as it is typed.
        // clap takes owned names only with its `string` feature, which would rebuild it for
        // every crate: a few bytes leaked once per page by a process that exits right after.
        let page = sub
            .clone()
            .name(leak(name.clone()))
            .bin_name(format!("gpreempt {}", sub.get_name()))
            .version(leak(version.clone()));
        write(name, page)?;
    }
    Ok(written)
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_page_per_visible_command_each_with_its_synopsis() {
        let dir = tempfile::tempdir().unwrap();
        let written = pages(dir.path()).unwrap();
        let names: Vec<String> =
            written.iter().map(|p| Path::new(p).file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(
            names,
            [
                "gpreempt.1",
                "gpreempt-doctor.1",
                "gpreempt-schedule.1",
                "gpreempt-evaluate.1",
                "gpreempt-top.1",
                "gpreempt-ps.1",
                "gpreempt-queues.1",
                "gpreempt-preempt.1",
                "gpreempt-trace.1",
                "gpreempt-agent.1",
                "gpreempt-analyze.1",
            ]
        );
        let version = env!("CARGO_PKG_VERSION");
        let doctor = fs::read_to_string(dir.path().join("gpreempt-doctor.1")).unwrap();
        assert!(doctor.contains(&format!("\n.TH GPREEMPT-DOCTOR 1  \"gpreempt {version}\" \n")), "{doctor}");
        assert!(
            doctor.contains("\n.SH SYNOPSIS\n\\fBgpreempt doctor\\fR [\\fB\\-j\\fR|\\fB\\-\\-json\\fR]"),
            "{doctor}"
        );
        let top = fs::read_to_string(dir.path().join("gpreempt.1")).unwrap();
        // The hidden generators and clap's `help` have no page to point to.
        for absent in ["completions", "gpreempt\\-man", "gpreempt\\-help"] {
            assert!(!top.contains(absent), "{absent} in {top}");
        }
        assert!(top.contains("\ngpreempt\\-schedule(1)\n"), "{top}");
        let preempt = fs::read_to_string(dir.path().join("gpreempt-preempt.1")).unwrap();
        assert!(preempt.contains("\\-\\-hold") && !preempt.contains("hold\\-ms"), "{preempt}");
    }

    #[test]
    fn completions_offer_what_help_shows_and_nothing_hidden() {
        for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh, clap_complete::Shell::Fish] {
            let script = script(shell).unwrap();
            for shown in ["schedule", "analyze", "hold", "busy-share", "log"] {
                assert!(script.contains(shown), "{shell}: no {shown}");
            }
            for hidden in ["completions", "hold-ms", "idle-ms", "empty-probes", "btf-dir"] {
                assert!(!script.contains(hidden), "{shell}: {hidden}");
            }
        }
        let bash = script(clap_complete::Shell::Bash).unwrap();
        assert!(bash.contains("complete -F _gpreempt -o nosort -o bashdefault -o default gpreempt\n"), "{bash}");
    }
}
