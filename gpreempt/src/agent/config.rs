//! The agent's configuration file (TOML): where metrics are served, how long an exited
//! process's series stay, and the scheduling policies. Every error names its line.
//!
//! ```toml
//! metrics_addr = "127.0.0.1:9464"   # --metrics-addr wins
//! process_grace_s = 60              # an exited process's series stay this long
//! cri_socket = "/run/containerd/containerd.sock"  # for pod-label:; --cri-socket wins
//!
//! [[policy]]
//! name = "inference-first"
//! online = ["pod-label:gpreempt.io/role=online"]
//! offline = ["pod-label:gpreempt.io/role=offline", "pod:batch/*"]
//! idle = "2ms"               # any `gpreempt schedule` setting, `-` as `_`, same units
//! offline_min_share = 0.1    # and defaults (SchedulerSettings)
//! ```
//!
//! Three keys have an older spelling, kept as aliases: `idle_ms = 50`, `poll_us`, `max_suspend_ms`
//! (bare numbers in the unit their name carries). Each parses with a warning naming its line and
//! the key to write instead.
//!
//! Policies must not contradict one another ([`overlap`](super::overlap)): a selector online in one
//! policy may not overlap one offline in another (or in the same), and two policies may not hold
//! overlapping offline selectors. Such a file is refused with every conflict named.

use std::{collections::HashSet, net::SocketAddr, ops::Range, path::Path, time::Duration};

use serde::Deserialize;
use toml::Spanned;

use super::overlap::{overlaps, what};
use crate::{host::select::Selector, schedule::SchedulerSettings};

/// The default `--metrics-addr`: loopback only, the port Prometheus's exporter list gives the
/// next free slot after AMD's device-metrics exporter.
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9464";
/// How long an exited process's series stay by default.
pub const DEFAULT_PROCESS_GRACE: Duration = Duration::from_secs(60);

/// A validated configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentConfig {
    pub metrics_addr: Option<SocketAddr>,
    /// The node's CRI runtime socket (`pod-label:` selectors); applied at start and at every
    /// reload ([`super::cri`]).
    pub cri_socket: Option<String>,
    pub process_grace: Duration,
    pub policies: Vec<AgentPolicy>,
    /// The older key spellings the file uses, one line each (for the log).
    pub warnings: Vec<String>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            metrics_addr: None,
            cri_socket: None,
            process_grace: DEFAULT_PROCESS_GRACE,
            policies: Vec::new(),
            warnings: Vec::new(),
        }
    }
}

/// One scheduling policy: while an online process uses the GPU, its offline processes are
/// suspended (within the settings).
#[derive(Clone, Debug, PartialEq)]
pub struct AgentPolicy {
    pub name: String,
    pub online: Vec<Selector>,
    pub offline: Vec<Selector>,
    pub settings: SchedulerSettings,
}

/// The older key spellings: their bare number's unit and the key to write instead.
const OLD_KEYS: [(&str, &str, &str); 3] =
    [("idle_ms", "ms", "idle"), ("poll_us", "us", "poll"), ("max_suspend_ms", "ms", "max_suspend")];

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {cause}")]
    Read { path: String, cause: std::io::Error },
    /// Syntax or shape: the TOML parser's message (it names line and column).
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{path}, line {line}: {message}")]
    Invalid { path: String, line: usize, message: String },
    /// Policies that contradict one another: one line per conflict, each located.
    #[error("{}", .0.join("\n"))]
    Conflicts(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    metrics_addr: Option<Spanned<String>>,
    cri_socket: Option<String>,
    process_grace_s: Option<Spanned<u64>>,
    #[serde(default)]
    policy: Vec<Spanned<RawPolicy>>,
}

/// A `[[policy]]` table: `name`, `online` and `offline`, then scheduler settings. Read as a
/// table because serde's `flatten` loses the spans every error is located by.
type RawPolicy = toml::Table;

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
        let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
        let invalid = |span: Range<usize>, message: String| ConfigError::Invalid {
            path: path.to_owned(),
            line: line_of(span.start),
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
        let mut warnings = Vec::new();
        // Each policy's lines of `online` and `offline`, for the conflicts between policies.
        let mut lines = Vec::new();
        for p in raw.policy {
            let span = p.span();
            let mut table = p.into_inner();
            // The line of `key` inside this table (a key starts its line), else the table's.
            // toml spans an array-of-tables element by its header only: its keys run to the next
            // header.
            let body_start = span.start.min(text.len());
            let rest = &text[body_start..];
            let body_len = rest.get(1..).and_then(|r| r.find("\n[")).map_or(rest.len(), |i| i + 1);
            let body = &text[body_start..body_start + body_len];
            let key_span = |key: &str| -> Range<usize> {
                let at = body
                    .match_indices(key)
                    .map(|(i, _)| i)
                    .find(|&i| {
                        (i == 0 || body[..i].ends_with('\n')) && body[i + key.len()..].trim_start().starts_with('=')
                    })
                    .map_or(body_start, |i| body_start + i);
                at..at
            };
            let name = match table.remove("name") {
                Some(toml::Value::String(n)) => n.trim().to_owned(),
                Some(_) => return Err(invalid(key_span("name"), "policy `name` must be a string".into())),
                None => return Err(invalid(span.clone(), "a [[policy]] without `name`".into())),
            };
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
                return Err(invalid(
                    key_span("name"),
                    format!("policy name `{name}`: use letters, digits, `-`, `_`, `.`"),
                ));
            }
            if !names.insert(name.clone()) {
                return Err(invalid(key_span("name"), format!("policy `{name}` is defined twice")));
            }
            let mut selectors = |side: &str| -> Result<Vec<Selector>, ConfigError> {
                let list = match table.remove(side) {
                    Some(toml::Value::Array(list)) => list,
                    Some(_) => {
                        return Err(invalid(
                            key_span(side),
                            format!("policy `{name}`: `{side}` must be a list of selectors"),
                        ));
                    }
                    None => return Err(invalid(span.clone(), format!("policy `{name}` has no `{side}`"))),
                };
                if list.is_empty() {
                    return Err(invalid(key_span(side), format!("policy `{name}`: `{side}` names no process")));
                }
                list.iter()
                    .map(|v| {
                        // A pid may be written as a number (`offline = [4242]`).
                        let s = match v {
                            toml::Value::String(s) => s.clone(),
                            toml::Value::Integer(n) => n.to_string(),
                            other => {
                                let other = match other {
                                    toml::Value::Float(f) => f.to_string(),
                                    toml::Value::Boolean(b) => b.to_string(),
                                    other => format!("a {}", other.type_str()),
                                };
                                return Err(invalid(
                                    key_span(side),
                                    format!(
                                        "policy `{name}`, {side}: `{other}` is not a selector: write a host pid, \
                                         \"container:NAME\", \"pod:NAMESPACE/NAME\" or \"pod-label:KEY=VALUE\""
                                    ),
                                ));
                            }
                        };
                        s.parse::<Selector>()
                            .map_err(|e| invalid(key_span(side), format!("policy `{name}`, {side}: {e}")))
                    })
                    .collect()
            };
            let online = selectors("online")?;
            let offline = selectors("offline")?;
            if let Some(both) = online.iter().find(|s| offline.contains(s)) {
                return Err(invalid(
                    key_span("offline"),
                    format!("policy `{name}`: {both} is both online and offline"),
                ));
            }
            for on in &online {
                if let Some(off) = offline.iter().find(|off| overlaps(on, off)) {
                    return Err(invalid(
                        key_span("offline"),
                        format!(
                            "policy `{name}`: online {on} and offline {off} can name the same {}, which cannot be \
                             both; narrow one of them",
                            what(on)
                        ),
                    ));
                }
            }
            lines.push((line_of(key_span("online").start), line_of(key_span("offline").start)));
            for (old, unit, new) in OLD_KEYS {
                let Some(value) = table.remove(old) else { continue };
                let number = match &value {
                    toml::Value::Integer(n) if *n > 0 => *n as f64,
                    toml::Value::Float(f) if *f > 0.0 => *f,
                    _ => {
                        return Err(invalid(
                            key_span(old),
                            format!("policy `{name}`: {old} must be a number greater than 0"),
                        ));
                    }
                };
                if table.contains_key(new) {
                    return Err(invalid(
                        key_span(old),
                        format!("policy `{name}`: {old} and {new} are the same setting: keep {new}"),
                    ));
                }
                let line = line_of(key_span(old).start);
                warnings.push(format!(
                    "{path}, line {line}: `{old} = {number}` is an older spelling kept as an alias: write {new} = \"{number}{unit}\""
                ));
                table.insert(new.into(), toml::Value::String(format!("{number}{unit}")));
            }
            // Each key alone first, so that an error names its line; then all of them.
            for (key, value) in &table {
                let one = toml::Table::from_iter([(key.clone(), value.clone())]);
                if let Err(e) = one.try_into::<SchedulerSettings>() {
                    return Err(invalid(key_span(key), format!("policy `{name}`, {key}: {}", e.message())));
                }
            }
            let settings = table
                .try_into::<SchedulerSettings>()
                .map_err(|e| invalid(span.clone(), format!("policy `{name}`: {}", e.message())))?;
            policies.push(AgentPolicy { name, online, offline, settings });
        }
        let conflicts = conflicts(&policies, &lines);
        if !conflicts.is_empty() {
            return Err(ConfigError::Conflicts(
                conflicts.into_iter().map(|(line, message)| format!("{path}, line {line}: {message}")).collect(),
            ));
        }
        Ok(Self { metrics_addr, cri_socket: raw.cri_socket, process_grace, policies, warnings })
    }
}

/// The conflicts between policies, each at the line of the later policy's selectors: a selector
/// offline in one that overlaps one online in an earlier one (or the reverse), and overlapping
/// offline selectors in two. `lines[i]` is policy `i`'s lines of `online` and `offline`.
fn conflicts(policies: &[AgentPolicy], lines: &[(usize, usize)]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let pairs = |a: &[Selector], b: &[Selector]| -> Vec<(Selector, Selector)> {
        a.iter().flat_map(|x| b.iter().filter(|y| overlaps(x, y)).map(move |y| (x.clone(), y.clone()))).collect()
    };
    let same = |x: &Selector, y: &Selector| {
        if x == y { format!("{x}") } else { format!("{x} and {y} (they can name the same {})", what(x)) }
    };
    for (j, later) in policies.iter().enumerate() {
        let (online_line, offline_line) = lines[j];
        for (i, earlier) in policies[..j].iter().enumerate() {
            let (a, b) = (&earlier.name, &later.name);
            let (earlier_online, earlier_offline) = lines[i];
            for (x, y) in pairs(&earlier.online, &later.offline) {
                out.push((
                    offline_line,
                    format!(
                        "policy `{b}` holds {y} offline, but policy `{a}` (line {earlier_online}) runs {x} online: \
                         a process of both would be held and protected at once; narrow one of them"
                    ),
                ));
            }
            for (x, y) in pairs(&earlier.offline, &later.online) {
                out.push((
                    online_line,
                    format!(
                        "policy `{b}` runs {y} online, but policy `{a}` (line {earlier_offline}) holds {x} offline: \
                         a process of both would be held and protected at once; narrow one of them"
                    ),
                ));
            }
            for (x, y) in pairs(&earlier.offline, &later.offline) {
                out.push((
                    offline_line,
                    format!(
                        "policies `{a}` (line {earlier_offline}) and `{b}` both hold {} offline: two schedulers \
                         would suspend and resume the same processes; keep them in one policy",
                        same(&x, &y)
                    ),
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = include_str!("../../../deploy/agent.toml");

    fn err(text: &str) -> String {
        AgentConfig::parse(text, "agent.toml").unwrap_err().to_string()
    }

    #[test]
    fn the_sample_config_parses_with_its_policy_commented_out_and_in() {
        let c = AgentConfig::parse(SAMPLE, "agent.toml").unwrap();
        assert_eq!(c, AgentConfig::default(), "the sample schedules nothing until a policy is written");
        // The sample's policy, uncommented: the lines after `[[policy]]` that start with `# `.
        let policy: String = SAMPLE
            .lines()
            .skip_while(|l| *l != "# [[policy]]")
            .map_while(|l| l.strip_prefix("# "))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(policy.starts_with("[[policy]]\n"), "{policy}");
        let c = AgentConfig::parse(&policy, "agent.toml").unwrap();
        assert_eq!(c.policies.len(), 1);
        let p = &c.policies[0];
        assert_eq!(p.name, "inference-first");
        assert_eq!(p.online, [Selector::PodLabel("pod-label:gpreempt.io/role=online".parse().unwrap())]);
        assert_eq!(p.offline, [Selector::PodLabel("pod-label:gpreempt.io/role=offline".parse().unwrap())]);
        assert_eq!(
            p.settings,
            SchedulerSettings {
                offline_min_share: 0.1,
                max_suspend: Duration::from_secs(2),
                ..SchedulerSettings::default()
            }
        );
        assert!(c.warnings.is_empty());
    }

    #[test]
    fn the_older_key_spellings_parse_with_a_warning_each() {
        let text = "[[policy]]\nname = \"a\"\nonline = [\"1\"]\noffline = [\"7\"]\nidle_ms = 50\npoll_us = 500\nmax_suspend_ms = 2000\n";
        let c = AgentConfig::parse(text, "agent.toml").unwrap();
        assert_eq!(
            c.policies[0].settings,
            SchedulerSettings {
                idle: Duration::from_millis(50),
                poll: Duration::from_micros(500),
                max_suspend: Duration::from_secs(2),
                ..SchedulerSettings::default()
            }
        );
        assert_eq!(
            c.warnings,
            [
                "agent.toml, line 5: `idle_ms = 50` is an older spelling kept as an alias: write idle = \"50ms\"",
                "agent.toml, line 6: `poll_us = 500` is an older spelling kept as an alias: write poll = \"500us\"",
                "agent.toml, line 7: `max_suspend_ms = 2000` is an older spelling kept as an alias: write max_suspend = \"2000ms\"",
            ]
        );
        assert_eq!(
            err("[[policy]]\nname = \"a\"\nonline = [\"1\"]\noffline = [\"7\"]\nidle = \"1ms\"\nidle_ms = 5\n"),
            "agent.toml, line 6: policy `a`: idle_ms and idle are the same setting: keep idle"
        );
    }

    #[test]
    fn an_empty_file_is_the_default() {
        assert_eq!(AgentConfig::parse("", "agent.toml").unwrap(), AgentConfig::default());
    }

    #[test]
    fn pids_may_be_written_as_numbers() {
        let c = AgentConfig::parse("[[policy]]\nname = \"a\"\nonline = [4242]\noffline = [\"7\", 8]\n", "agent.toml")
            .unwrap();
        assert_eq!(c.policies[0].online, [Selector::Pid(crate::domain::HostPid(4242))]);
        assert_eq!(
            c.policies[0].offline,
            [Selector::Pid(crate::domain::HostPid(7)), Selector::Pid(crate::domain::HostPid(8))]
        );
        assert_eq!(
            err("[[policy]]\nname = \"a\"\nonline = [0]\noffline = [\"7\"]\n"),
            "agent.toml, line 3: policy `a`, online: pid 0 names no process; give the host pid of a KFD process (see `gpreempt ps`)"
        );
        assert_eq!(
            err("[[policy]]\nname = \"a\"\nonline = [1.5]\noffline = [\"7\"]\n"),
            "agent.toml, line 3: policy `a`, online: `1.5` is not a selector: write a host pid, \"container:NAME\", \"pod:NAMESPACE/NAME\" or \"pod-label:KEY=VALUE\""
        );
    }

    #[test]
    fn label_selectors_and_the_runtimes_socket() {
        let c = AgentConfig::parse(
            "cri_socket = \"unix:///run/k3s/containerd/containerd.sock\"\n[[policy]]\nname = \"a\"\n\
             online = [\"pod-label:gpreempt.io/role=online\"]\noffline = [\"pod-label:gpreempt.io/role=offline,tier!=canary\"]\n",
            "agent.toml",
        )
        .unwrap();
        assert_eq!(c.cri_socket.as_deref(), Some("unix:///run/k3s/containerd/containerd.sock"));
        assert_eq!(c.policies[0].offline[0].to_string(), "pod-label:gpreempt.io/role=offline,tier!=canary");
        assert_eq!(
            err("[[policy]]\nname = \"a\"\nonline = [\"pod-label:role=x\"]\noffline = [\"pod-label:app=y\"]\n"),
            "agent.toml, line 4: policy `a`: online pod-label:role=x and offline pod-label:app=y can name the same pod, \
             which cannot be both; narrow one of them"
        );
        assert_eq!(
            err("[[policy]]\nname = \"a\"\nonline = [\"pod-label:role\"]\noffline = [\"7\"]\n"),
            "agent.toml, line 3: policy `a`, online: `pod-label:role`: `role` is a set-based requirement (in, notin, \
             exists), which gpreempt does not take; write pod-label:KEY=VALUE[,KEY2=VALUE2,KEY3!=VALUE3] (kubectl's \
             equality-based selector, e.g. pod-label:gpreempt.io/role=offline)"
        );
    }

    #[test]
    fn overlapping_selectors_within_a_policy_are_refused() {
        assert_eq!(
            err("[[policy]]\nname = \"a\"\nonline = [\"pod:serving/*\"]\noffline = [\"pod:*/vllm-0\"]\n"),
            "agent.toml, line 4: policy `a`: online pod:serving/* and offline pod:*/vllm-0 can name the same pod, \
             which cannot be both; narrow one of them"
        );
    }

    #[test]
    fn contradictory_policies_are_refused_with_every_conflict_named() {
        let text = "\
[[policy]]
name = \"serve\"
online = [\"pod:serving/*\"]
offline = [\"pod:batch/*\"]

[[policy]]
name = \"other\"
online = [\"4242\"]
offline = [\"pod:serving/vllm-0\", \"pod:batch/train-*\"]

[[policy]]
name = \"third\"
online = [\"pod:batch/eval\"]
offline = [\"container:trainer\"]

[[policy]]
name = \"fourth\"
online = [\"4243\"]
offline = [\"container:trainer\"]
";
        assert_eq!(
            err(text),
            "agent.toml, line 9: policy `other` holds pod:serving/vllm-0 offline, but policy `serve` (line 3) runs \
             pod:serving/* online: a process of both would be held and protected at once; narrow one of them\n\
             agent.toml, line 9: policies `serve` (line 4) and `other` both hold pod:batch/* and pod:batch/train-* \
             (they can name the same pod) offline: two schedulers would suspend and resume the same processes; keep \
             them in one policy\n\
             agent.toml, line 13: policy `third` runs pod:batch/eval online, but policy `serve` (line 4) holds \
             pod:batch/* offline: a process of both would be held and protected at once; narrow one of them\n\
             agent.toml, line 19: policies `third` (line 14) and `fourth` both hold container:trainer offline: two \
             schedulers would suspend and resume the same processes; keep them in one policy"
        );
        // Policies over different pods, or sharing their online side, are fine.
        let fine = "[[policy]]\nname = \"a\"\nonline = [\"pod:serving/*\"]\noffline = [\"pod:batch/a-*\"]\n\
                    [[policy]]\nname = \"b\"\nonline = [\"pod:serving/*\"]\noffline = [\"pod:batch/b-*\"]\n";
        assert_eq!(AgentConfig::parse(fine, "agent.toml").unwrap().policies.len(), 2);
    }

    #[test]
    fn errors_name_their_line() {
        assert_eq!(
            err("process_grace_s = 5\n\n[[policy]]\nname = \"a\"\nonline = [\"42\"]\noffline = [\"pod:batch\"]\n"),
            "agent.toml, line 6: policy `a`, offline: `pod:batch` is not a pod selector: write pod:NAMESPACE/NAME (globs allowed, e.g. pod:batch/train-*)"
        );
        assert_eq!(
            err("[[policy]]\nname = \"a\"\nonline = [\"42\"]\noffline = [\"7\"]\noffline_min_share = 1.5\n"),
            "agent.toml, line 5: policy `a`, offline_min_share: `1.5` is not a share in [0, 1) (e.g. 0.2 for 20 %)"
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
            "agent.toml, line 5: policy `a`: idle_ms must be a number greater than 0"
        );
        assert_eq!(
            err("[[policy]]\nname = \"a\"\nonline = [\"1\"]\noffline = [\"7\"]\n\nidle = \"50\"\n"),
            "agent.toml, line 6: policy `a`, idle: `50` has no unit: write 50ms (units: ns, us (or µs), ms, s, m, h)"
        );
        let unknown = err("[[policy]]\nname = \"a\"\nonline = [\"1\"]\noffline = [\"7\"]\nidel = \"5ms\"\n");
        assert!(
            unknown.starts_with("agent.toml, line 5: policy `a`, idel: unknown field `idel`, expected one of `idle`"),
            "{unknown}"
        );
        assert_eq!(
            err("[[policy]]\nname = \"a\"\noffline = [\"7\"]\n"),
            "agent.toml, line 1: policy `a` has no `online`"
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
