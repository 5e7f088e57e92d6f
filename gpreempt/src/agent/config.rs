//! The agent's configuration file (TOML): where metrics are served, how long an exited
//! process's series stay, and the scheduling policies. Every error names its line.
//!
//! ```toml
//! metrics_addr = "127.0.0.1:9464"   # --metrics-addr wins
//! process_grace_s = 60              # an exited process's series stay this long
//!
//! [[policy]]
//! name = "inference-first"
//! online = ["pod:serving/llm-*"]
//! offline = ["pod:batch/*", "container:trainer"]
//! idle_ms = 50               # online idle this long: resume the offline processes
//! poll_us = 500              # how often the online processes' queues are sampled
//! offline_min_share = 0.1    # the offline processes run at least this share of the time
//! max_suspend_ms = 2000      # never keep them suspended longer than this at once
//! ```

use std::{collections::HashSet, net::SocketAddr, ops::Range, path::Path, time::Duration};

use serde::Deserialize;
use toml::Spanned;

use crate::host::select::Selector;

/// The default `--metrics-addr`: loopback only, the port Prometheus's exporter list gives the
/// next free slot after AMD's device-metrics exporter.
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9464";
/// How long an exited process's series stay by default.
pub const DEFAULT_PROCESS_GRACE: Duration = Duration::from_secs(60);

/// A validated configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentConfig {
    pub metrics_addr: Option<SocketAddr>,
    pub process_grace: Duration,
    pub policies: Vec<AgentPolicy>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self { metrics_addr: None, process_grace: DEFAULT_PROCESS_GRACE, policies: Vec::new() }
    }
}

/// One scheduling policy: while an online process uses the GPU, its offline processes are
/// suspended (within the parameters).
#[derive(Clone, Debug, PartialEq)]
pub struct AgentPolicy {
    pub name: String,
    pub online: Vec<Selector>,
    pub offline: Vec<Selector>,
    pub params: SchedulerParams,
}

/// The scheduler's parameters of one policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SchedulerParams {
    /// Online idle this long: resume the offline processes.
    pub idle: Duration,
    /// Sampling period of the online processes' queues.
    pub poll: Duration,
    /// Share of time (0 ≤ share < 1) the offline processes run at least.
    pub offline_min_share: f64,
    /// Longest single suspension.
    pub max_suspend: Duration,
}

impl Default for SchedulerParams {
    fn default() -> Self {
        Self {
            idle: Duration::from_millis(50),
            poll: Duration::from_micros(500),
            offline_min_share: 0.0,
            max_suspend: Duration::from_secs(2),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {cause}")]
    Read { path: String, cause: std::io::Error },
    /// Syntax or shape: the TOML parser's message (it names line and column).
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{path}, line {line}: {message}")]
    Invalid { path: String, line: usize, message: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    metrics_addr: Option<Spanned<String>>,
    process_grace_s: Option<Spanned<u64>>,
    #[serde(default)]
    policy: Vec<Spanned<RawPolicy>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    name: Spanned<String>,
    online: Spanned<Vec<Spanned<String>>>,
    offline: Spanned<Vec<Spanned<String>>>,
    idle_ms: Option<Spanned<u64>>,
    poll_us: Option<Spanned<u64>>,
    offline_min_share: Option<Spanned<f64>>,
    max_suspend_ms: Option<Spanned<u64>>,
}

impl AgentConfig {
    /// Read and validate `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.display().to_string(), cause: source })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parse and validate `text` (named `path` in errors).
    pub fn parse(text: &str, path: &str) -> Result<Self, ConfigError> {
        let raw: RawConfig =
            toml::from_str(text).map_err(|e| ConfigError::Parse { path: path.to_owned(), message: e.to_string() })?;
        let invalid = |span: Range<usize>, message: String| ConfigError::Invalid {
            path: path.to_owned(),
            line: text[..span.start.min(text.len())].matches('\n').count() + 1,
            message,
        };
        let metrics_addr = match raw.metrics_addr {
            Some(a) => Some(
                a.get_ref()
                    .parse::<SocketAddr>()
                    .map_err(|e| invalid(a.span(), format!("metrics_addr `{}`: {e} (write IP:PORT)", a.get_ref())))?,
            ),
            None => None,
        };
        let process_grace = raw.process_grace_s.map_or(DEFAULT_PROCESS_GRACE, |g| Duration::from_secs(*g.get_ref()));
        let mut names = HashSet::new();
        let mut policies = Vec::new();
        for p in raw.policy {
            let p = p.into_inner();
            let name = p.name.get_ref().trim().to_owned();
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
                return Err(invalid(
                    p.name.span(),
                    format!("policy name `{name}`: use letters, digits, `-`, `_`, `.`"),
                ));
            }
            if !names.insert(name.clone()) {
                return Err(invalid(p.name.span(), format!("policy `{name}` is defined twice")));
            }
            let selectors = |list: &Spanned<Vec<Spanned<String>>>, side: &str| -> Result<Vec<Selector>, ConfigError> {
                if list.get_ref().is_empty() {
                    return Err(invalid(list.span(), format!("policy `{name}`: `{side}` names no process")));
                }
                list.get_ref()
                    .iter()
                    .map(|s| {
                        s.get_ref()
                            .parse::<Selector>()
                            .map_err(|e| invalid(s.span(), format!("policy `{name}`, {side}: {e}")))
                    })
                    .collect()
            };
            let online = selectors(&p.online, "online")?;
            let offline = selectors(&p.offline, "offline")?;
            if let Some(both) = online.iter().find(|s| offline.contains(s)) {
                return Err(invalid(p.offline.span(), format!("policy `{name}`: {both} is both online and offline")));
            }
            let mut params = SchedulerParams::default();
            let positive = |v: &Option<Spanned<u64>>, key: &str| -> Result<Option<u64>, ConfigError> {
                match v {
                    Some(v) if *v.get_ref() == 0 => {
                        Err(invalid(v.span(), format!("policy `{name}`: {key} must be greater than 0")))
                    }
                    Some(v) => Ok(Some(*v.get_ref())),
                    None => Ok(None),
                }
            };
            if let Some(ms) = positive(&p.idle_ms, "idle_ms")? {
                params.idle = Duration::from_millis(ms);
            }
            if let Some(us) = positive(&p.poll_us, "poll_us")? {
                params.poll = Duration::from_micros(us);
            }
            if let Some(ms) = positive(&p.max_suspend_ms, "max_suspend_ms")? {
                params.max_suspend = Duration::from_millis(ms);
            }
            if let Some(share) = &p.offline_min_share {
                let v = *share.get_ref();
                if !(0.0..1.0).contains(&v) {
                    return Err(invalid(
                        share.span(),
                        format!("policy `{name}`: offline_min_share {v} is outside [0, 1)"),
                    ));
                }
                params.offline_min_share = v;
            }
            policies.push(AgentPolicy { name, online, offline, params });
        }
        Ok(Self { metrics_addr, process_grace, policies })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = include_str!("../../../deploy/agent.toml");

    fn err(text: &str) -> String {
        AgentConfig::parse(text, "agent.toml").unwrap_err().to_string()
    }

    #[test]
    fn the_sample_config_parses() {
        let c = AgentConfig::parse(SAMPLE, "agent.toml").unwrap();
        assert_eq!(c.metrics_addr, None);
        assert_eq!(c.process_grace, Duration::from_secs(60));
        assert_eq!(c.policies.len(), 1);
        let p = &c.policies[0];
        assert_eq!(p.name, "inference-first");
        assert_eq!(p.online, [Selector::Pod("pod:serving/llm-*".parse().unwrap())]);
        assert_eq!(p.offline, [Selector::Pod("pod:batch/*".parse().unwrap()), Selector::Container("trainer".into())]);
        assert_eq!(
            p.params,
            SchedulerParams {
                idle: Duration::from_millis(50),
                poll: Duration::from_micros(500),
                offline_min_share: 0.1,
                max_suspend: Duration::from_millis(2000),
            }
        );
    }

    #[test]
    fn an_empty_file_is_the_default() {
        assert_eq!(AgentConfig::parse("", "agent.toml").unwrap(), AgentConfig::default());
    }

    #[test]
    fn errors_name_their_line() {
        assert_eq!(
            err("process_grace_s = 5\n\n[[policy]]\nname = \"a\"\nonline = [\"42\"]\noffline = [\"pod:batch\"]\n"),
            "agent.toml, line 6: policy `a`, offline: `pod:batch` is not a pod selector: write pod:NAMESPACE/NAME (globs allowed, e.g. pod:batch/train-*)"
        );
        assert_eq!(
            err("[[policy]]\nname = \"a\"\nonline = [\"42\"]\noffline = [\"7\"]\noffline_min_share = 1.5\n"),
            "agent.toml, line 5: policy `a`: offline_min_share 1.5 is outside [0, 1)"
        );
        assert_eq!(
            err("[[policy]]\nname = \"a\"\nonline = [\"42\"]\noffline = [\"42\"]\n"),
            "agent.toml, line 4: policy `a`: 42 is both online and offline"
        );
        assert_eq!(
            err("[[policy]]\nname = \"a\"\nonline = []\noffline = [\"7\"]\n"),
            "agent.toml, line 3: policy `a`: `online` names no process"
        );
        assert_eq!(
            err("[[policy]]\nname = \"a\"\nonline = [\"1\"]\noffline = [\"7\"]\nidle_ms = 0\n"),
            "agent.toml, line 5: policy `a`: idle_ms must be greater than 0"
        );
        assert_eq!(
            err(
                "[[policy]]\nname = \"a\"\nonline = [\"1\"]\noffline = [\"7\"]\n[[policy]]\nname = \"a\"\nonline = [\"2\"]\noffline = [\"8\"]\n"
            ),
            "agent.toml, line 6: policy `a` is defined twice"
        );
        assert_eq!(
            err("metrics_addr = \"localhost\"\n"),
            "agent.toml, line 1: metrics_addr `localhost`: invalid socket address syntax (write IP:PORT)"
        );
        let syntax = err("process_grace_s = 5\npolicy = [\n");
        assert!(syntax.starts_with("agent.toml: TOML parse error at line 2, column 11"), "{syntax}");
        let unknown = err("\nidle = 5\n");
        assert!(unknown.contains("line 2") && unknown.contains("unknown field `idle`"), "{unknown}");
    }
}
