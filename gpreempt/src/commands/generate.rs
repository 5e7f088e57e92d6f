//! `gpreempt completions SHELL` and `gpreempt man DIR` (hidden): the shell completions and the man
//! pages, generated from the same clap definitions that parse the command line, so they cannot
//! drift from it. `cargo xtask dist` runs both on the binary it packages; a user of the bare
//! static binary runs them to install what the Debian package ships (docs/install.md).

use std::{fs, path::Path};

use anyhow::{Context, Result};
use clap::CommandFactory;

use gpreempt::agent::manual::{self, roff_escape, roff_example};

use super::{examples, stdout::out};
use crate::cli::{Cli, CompletionsArgs, ManArgs};

/// Where the packages put the documentation the pages and the help cite as `docs/…`.
const DOC_DIR: &str = "/usr/share/doc/gpreempt";

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
/// subcommand a user runs (the hidden ones and clap's `help` have none), each with EXAMPLES and
/// SEE ALSO, and the configuration's `gpreempt-agent.toml.5`. Prints the files written.
pub fn man(args: &ManArgs) -> Result<()> {
    fs::create_dir_all(&args.dir).with_context(|| format!("cannot create {}", args.dir.display()))?;
    for file in pages(&args.dir)? {
        super::stdout::outln!("{}", file);
    }
    Ok(())
}

/// The sections after clap's: EXAMPLES of `command`, then SEE ALSO with where the cited docs are.
fn tail(command: &str) -> String {
    let mut roff = String::new();
    let examples = examples::of(command);
    if !examples.is_empty() {
        roff.push_str(".SH EXAMPLES\n");
        for (what, line) in examples {
            roff.push_str(&format!(".PP\n{}\n", roff_escape(what)));
            roff.push_str(&roff_example(line));
        }
    }
    roff.push_str(".SH SEE ALSO\n");
    let mut see: Vec<String> = Vec::new();
    if command != "gpreempt" {
        see.push("\\fBgpreempt\\fR(1)".to_owned());
    }
    if command == "agent" {
        see.push(format!("\\fB{}\\fR(5)", roff_escape(manual::CONFIG_PAGE)));
    }
    roff.push_str(&see.join(", "));
    if !see.is_empty() {
        roff.push('\n');
    }
    roff.push_str(&format!(
        ".PP\nThe documentation these pages and \\fB\\-\\-help\\fR cite as docs/\\&... is in {}: \
         README.md, docs/cli.md (conventions and exit codes), docs/guide/ (one guide per task).\n",
        roff_escape(DOC_DIR)
    ));
    roff
}

fn pages(dir: &Path) -> Result<Vec<String>> {
    let mut cmd = Cli::command();
    // Built once so every subcommand carries the version, the global --log and the generated
    // `help` subcommand, as `--help` shows them.
    cmd.build();
    let mut written = Vec::new();
    let version = cmd.get_version().unwrap_or_default().to_owned();
    let mut write = |name: String, command: &str, page: clap::Command| -> Result<()> {
        let path = dir.join(format!("{name}.1"));
        let mut roff = Vec::new();
        clap_mangen::Man::new(page)
            .title(name.to_uppercase())
            .source(format!("gpreempt {version}"))
            .render(&mut roff)?;
        roff.extend_from_slice(tail(command).as_bytes());
        fs::write(&path, roff).with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path.display().to_string());
        Ok(())
    };
    // The top page lists the subcommands, each as its page: clap's `help` has none.
    write("gpreempt".to_owned(), "gpreempt", Cli::command().disable_help_subcommand(true))?;
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
        write(name, sub.get_name(), page)?;
    }
    let path = dir.join(format!("{}.5", manual::CONFIG_PAGE));
    fs::write(&path, manual::config_page(&version)).with_context(|| format!("cannot write {}", path.display()))?;
    written.push(path.display().to_string());
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
                "gpreempt-agent.toml.5",
            ]
        );
        // Every command page has examples and says where the docs it cites are.
        for name in &names[..names.len() - 1] {
            let page = fs::read_to_string(dir.path().join(name)).unwrap();
            assert!(page.contains("\n.SH EXAMPLES\n.PP\n"), "{name}");
            assert!(page.contains(" is in /usr/share/doc/gpreempt: README.md, docs/cli.md"), "{name}");
        }
        let agent = fs::read_to_string(dir.path().join("gpreempt-agent.1")).unwrap();
        assert!(
            agent.contains(
                "\n.PP\nCheck a configuration without starting anything:\n.PP\n.RS 4\n.nf\n\
                 gpreempt agent \\-\\-check /etc/gpreempt/agent.toml\n.fi\n.RE\n"
            ),
            "{agent}"
        );
        assert!(agent.contains("\\fBgpreempt\\-agent.toml\\fR(5)"), "{agent}");
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

    /// Each example of a gpreempt command line parses as the command line would (the ones that
    /// pipe, substitute or redirect are checked up to that point).
    #[test]
    fn every_example_is_a_valid_command_line() {
        let commands: Vec<String> =
            Cli::command().get_subcommands().filter(|s| !s.is_hide_set()).map(|s| s.get_name().to_owned()).collect();
        for (command, examples) in examples::EXAMPLES {
            assert!(*command == "gpreempt" || commands.iter().any(|c| c == command), "{command}");
            for (_, line) in *examples {
                // A command substitution: the inner command, and the outer one with a value.
                let lines = match line.split_once("$(").and_then(|(a, b)| Some((a, b.split_once(')')?))) {
                    Some((before, (inner, after))) => vec![inner.to_owned(), format!("{before}1{after}")],
                    None => vec![(*line).to_owned()],
                };
                for line in &lines {
                    let line = line.trim_start_matches("sudo ");
                    if !line.starts_with("gpreempt ") {
                        continue;
                    }
                    let words = split(line.split(['|', '>']).next().unwrap());
                    match <Cli as clap::Parser>::try_parse_from(&words) {
                        Ok(_) => {}
                        // The load generator is on the user's host, not here.
                        Err(e) if e.to_string().contains("is not found in PATH") => {}
                        Err(e) => panic!("{line}: {e}"),
                    }
                }
            }
        }
    }

    /// Words as sh splits them, for the examples' quoting: single quotes and backslashes.
    fn split(line: &str) -> Vec<String> {
        let (mut words, mut word, mut quoted, mut any) = (Vec::new(), String::new(), false, false);
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            match c {
                '\'' => (quoted, any) = (!quoted, true),
                '\\' if !quoted => word.extend(chars.next()),
                c if c.is_whitespace() && !quoted => {
                    if any || !word.is_empty() {
                        words.push(std::mem::take(&mut word));
                    }
                    any = false;
                }
                c => word.push(c),
            }
        }
        if any || !word.is_empty() {
            words.push(word);
        }
        words
    }
}
