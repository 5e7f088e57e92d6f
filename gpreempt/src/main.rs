//! The `gpreempt` binary: argument parsing and error reporting at the edge.
//!
//! Exit status (docs/cli.md): 0 success, 1 runtime error, 2 usage error (clap). A reader that
//! closes stdout early (`gpreempt doctor | head -1`) ends the output quietly, never with a
//! panic: SIGPIPE stays ignored (Rust's default), so a write gets EPIPE, and every result line
//! goes through `commands::stdout`, which stops writing there and lets the command finish its
//! cleanup (resuming queues, detaching) and exit as it would have.

mod cli;
mod commands;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let (args, legacy_json) = cli::rewrite_legacy_json(std::env::args_os().collect());
    let mut cli = cli::Cli::parse_from(args);
    env_logger::Builder::new().filter_level(cli.log).format_timestamp(None).init();
    if let Some(socket) = &cli.cri_socket {
        gpreempt::host::cri::CriSocket::configure(socket);
    }
    for warning in legacy_json.into_iter().chain(cli.deprecations()) {
        say(format_args!("gpreempt: warning: {warning}"));
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            say(format_args!("gpreempt: cannot start the async runtime: {e}"));
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            cli::Command::Trace(args) => commands::trace::run(args).await,
            cli::Command::Doctor(args) => commands::doctor::run(&args),
            cli::Command::Analyze(args) => commands::analyze::run(&args),
            cli::Command::Ps(args) => commands::ps::run(&args).await,
            cli::Command::Queues(args) => commands::queues::run(&args),
            cli::Command::Preempt(args) => commands::preempt::run(&args),
            cli::Command::Agent(args) => commands::agent::run(args).await,
            cli::Command::Schedule(args) => commands::schedule::run(&args),
            cli::Command::Evaluate(args) => commands::evaluate::run(&args),
            cli::Command::Top(args) => commands::top::run(&args),
            cli::Command::Completions(args) => commands::generate::completions(&args),
            cli::Command::Man(args) => commands::generate::man(&args),
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            say(format_args!("gpreempt: error: {e:#}"));
            std::process::ExitCode::FAILURE
        }
    }
}

/// A line on stderr; a closed stderr (`2>&1 | head -1`) loses it instead of panicking.
fn say(line: std::fmt::Arguments<'_>) {
    commands::stderr::line(line);
}
