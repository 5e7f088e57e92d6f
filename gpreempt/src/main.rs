//! The `gpreempt` binary: argument parsing and error reporting at the edge.

mod cli;
mod commands;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    env_logger::Builder::new().filter_level(cli.log).format_timestamp(None).init();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gpreempt: cannot start the async runtime: {e}");
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
            cli::Command::Top(args) => commands::top::run(&args),
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpreempt: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
