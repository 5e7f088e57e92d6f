//! `gpreempt agent`: the node daemon's parts that are not the tracer loop itself — its
//! configuration ([`config`]), which CRI socket its policies ask ([`cri`]), which policies
//! contradict one another ([`overlap`]), when it is reloaded ([`reload`]), its manual page
//! ([`manual`]), its HTTP endpoint ([`http`]), its log lines ([`log_line`]) and the seam through
//! which configured policies reach a scheduler ([`PolicyRunner`], run by [`policies::Policies`]).

pub mod config;
pub mod cri;
pub mod http;
pub mod manual;
pub mod overlap;
pub mod policies;
pub mod reload;

use std::fmt::Write as _;

pub use self::config::{AgentConfig, AgentPolicy};
use crate::{host::cri::CriSocket, model::ModelNotice};

/// One structured log line for stderr: `level=info msg="…" key=value …`, values quoted when
/// they hold spaces, quotes or `=`. journald keeps each line as one entry (with its own
/// timestamp), and `kubectl logs`/Loki parse the pairs.
pub fn log_line(level: &str, msg: &str, fields: &[(&str, &dyn std::fmt::Display)]) -> String {
    let mut line = format!("level={level} msg={}", quote(msg));
    for (key, value) in fields {
        let _ = write!(line, " {key}={}", quote(&value.to_string()));
    }
    line
}

fn quote(v: &str) -> String {
    if !v.is_empty() && !v.chars().any(|c| c.is_whitespace() || c == '"' || c == '=' || c.is_control()) {
        return v.to_owned();
    }
    let mut out = String::with_capacity(v.len() + 2);
    out.push('"');
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// What applies the configured policies to the processes the tracer sees. The agent calls
/// [`PolicyRunner::configure`] at start and after every accepted reload, hands it every lifecycle
/// notice of the model through [`PolicyRunner::notice`], and calls [`PolicyRunner::shutdown`] on
/// SIGTERM; a runner resumes and detaches every process it suspended before `shutdown` returns.
pub trait PolicyRunner {
    /// The policies in force from now on (replacing the previous ones), their `pod-label:`
    /// selectors asking the CRI runtime at `cri`. A policy whose scheduler could not start is
    /// started again, so a reload retries it.
    fn configure(&mut self, policies: &[AgentPolicy], cri: &CriSocket);
    /// A process or a queue appeared or went away (the model's notice).
    fn notice(&mut self, notice: ModelNotice);
    /// The agent is exiting: leave every process running and detached.
    fn shutdown(&mut self);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_are_key_value_pairs_quoted_only_when_needed() {
        assert_eq!(
            log_line("info", "listening", &[("addr", &"127.0.0.1:9464"), ("probes", &21)]),
            "level=info msg=listening addr=127.0.0.1:9464 probes=21"
        );
        assert_eq!(
            log_line("warn", "config rejected", &[("error", &"a.toml, line 3: `x` is \"bad\"\n")]),
            r#"level=warn msg="config rejected" error="a.toml, line 3: `x` is \"bad\"\n""#
        );
        assert_eq!(log_line("info", "", &[("k", &"")]), r#"level=info msg="" k="""#);
    }
}
