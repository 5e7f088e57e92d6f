//! gpreempt-agent.toml(5): the manual page of the agent's configuration file, written from what
//! the loader ([`super::config`]) accepts. The policy settings are listed from the clap
//! definitions of [`SchedulerSettings`] (their help and defaults), the same type that parses them,
//! so the page cannot drift from the loader; `gpreempt man DIR` writes it beside the commands'.

use std::fmt::Write as _;

use clap::Args;

use super::config::{DEFAULT_METRICS_ADDR, DEFAULT_PROCESS_GRACE};
use crate::schedule::SchedulerSettings;

/// The page's file name (`gpreempt-agent.toml.5`) without the section.
pub const CONFIG_PAGE: &str = "gpreempt-agent.toml";

/// Text as roff reads it: backslashes and hyphens escaped, a leading `.` or `'` kept literal.
pub fn roff_escape(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-");
    escaped
        .lines()
        .map(|l| if l.starts_with('.') || l.starts_with('\'') { format!("\\&{l}") } else { l.to_owned() })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A block of lines shown as typed (no filling), indented.
pub fn roff_example(lines: &str) -> String {
    format!(".PP\n.RS 4\n.nf\n{}\n.fi\n.RE\n", roff_escape(lines))
}

/// The settings a `[[policy]]` takes: `(key, help, default)`, in `gpreempt schedule --help` order.
pub fn policy_settings() -> Vec<(String, String, Option<String>)> {
    let cmd = SchedulerSettings::augment_args(clap::Command::new("settings"));
    cmd.get_arguments()
        .filter(|a| !a.is_hide_set())
        .map(|a| {
            let help = a.get_long_help().or_else(|| a.get_help()).map(ToString::to_string).unwrap_or_default();
            let defaults: Vec<String> =
                a.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
            let default = if defaults.is_empty() { None } else { Some(defaults.join(", ")) };
            (a.get_id().as_str().to_owned(), help.split_whitespace().collect::<Vec<_>>().join(" "), default)
        })
        .collect()
}

/// The whole page, roff, for `version`.
pub fn config_page(version: &str) -> String {
    let mut p = String::new();
    let _ = writeln!(p, ".TH GPREEMPT-AGENT.TOML 5 \"\" \"gpreempt {version}\" \"File Formats\"");
    p.push_str(".SH NAME\ngpreempt\\-agent.toml \\- configuration of the gpreempt node agent\n");
    p.push_str(".SH SYNOPSIS\n\\fB/etc/gpreempt/agent.toml\\fR (\\fBgpreempt agent \\-\\-config\\fR \\fIFILE\\fR)\n");
    let para = |p: &mut String, text: &str| {
        p.push_str(".PP\n");
        p.push_str(&roff_escape(text));
        p.push('\n');
    };
    let item = |p: &mut String, key: &str, text: &str| {
        let _ = writeln!(p, ".TP\n\\fB{}\\fR\n{}", roff_escape(key), roff_escape(text));
    };
    p.push_str(".SH DESCRIPTION\n");
    para(
        &mut p,
        "A TOML file: where the agent serves its metrics, how long an exited process's series stay, and \
         scheduling policies. The agent reloads it when its content changes (it watches the file's \
         directory, where a Kubernetes ConfigMap volume is updated) or on SIGHUP; a file that does not \
         load is rejected with its line named, and the configuration in force stays. \
         gpreempt agent --check FILE validates a file without starting anything (exit status 0 or 1).",
    );
    p.push_str(".SH KEYS\n");
    item(
        &mut p,
        "metrics_addr",
        &format!(
            "IP:PORT where /metrics and /healthz are served (--metrics-addr wins). Default: {DEFAULT_METRICS_ADDR}."
        ),
    );
    item(
        &mut p,
        "process_grace_s",
        &format!(
            "Seconds an exited process's series stay before they disappear. Default: {}.",
            DEFAULT_PROCESS_GRACE.as_secs()
        ),
    );
    item(
        &mut p,
        "cri_socket",
        "The node's CRI runtime socket (a path or unix:///path), asked which pods carry the labels of \
         pod-label: selectors (--cri-socket wins). A change applies at the reload that reads it: the \
         policies with pod-label: selectors restart on the new socket, the others run on. Default: \
         the kubelet's defaults, /run/containerd/containerd.sock then /var/run/crio/crio.sock.",
    );
    item(
        &mut p,
        "[[policy]]",
        "A scheduling policy (any number, none by default): while an online process has work on a GPU, \
         the queues of its offline processes on that GPU are suspended, within the settings below. \
         Each runs the scheduler of gpreempt schedule on a thread of its own.",
    );
    p.push_str(".SH POLICY KEYS\n");
    item(&mut p, "name", "The policy's name (letters, digits, -, _, .), unique in the file: a label of its series.");
    item(
        &mut p,
        "online, offline",
        "Lists of selectors, neither empty: \"pod-label:KEY=VALUE[,KEY2=VALUE2,KEY3!=VALUE3]\" (the pods \
         whose labels match, kubectl's equality syntax, asked of the CRI runtime), a host pid (a number \
         or a string), \"container:NAME\" (a container's name, full id or id prefix, or a Kubernetes \
         container's name) or \"pod:NAMESPACE/NAME\" (each part a glob with * and ?). Processes that \
         open /dev/kfd later are picked up.",
    );
    para(
        &mut p,
        "Every setting of gpreempt schedule, named as its flag with _ for -, with the same units and \
         defaults (durations are strings with a unit: \"2ms\", \"200us\"):",
    );
    for (key, help, default) in policy_settings() {
        let default = default.map(|d| format!(" Default: {d}.")).unwrap_or_default();
        let stop = if help.ends_with('.') { "" } else { "." };
        item(&mut p, &key, &format!("{help}{stop}{default}"));
    }
    para(
        &mut p,
        "Older spellings kept as aliases, each logged with the key to write instead: idle_ms, poll_us, \
         max_suspend_ms (bare numbers in the unit of the name).",
    );
    p.push_str(".SH CONFLICTS\n");
    para(
        &mut p,
        "A file whose policies contradict one another is refused, every conflict named with the policies, \
         their lines and the selectors: a selector online in one policy that overlaps one offline in \
         another or in the same (pod:serving/* and pod:serving/vllm-0), and two policies whose offline \
         selectors overlap (two schedulers would suspend and resume the same processes). Pod globs \
         overlap when some namespace and name match both, container selectors when equal or when one id \
         prefix extends the other, pids when equal, label selectors unless one asks a key for a value \
         the other asks for another value or refuses (gpreempt.io/role=online never meets \
         gpreempt.io/role=offline). Selectors of different kinds are not compared.",
    );
    p.push_str(".SH EXAMPLES\n");
    para(&mut p, "Serving pods first, training pods held while they have work, chosen by their labels:");
    p.push_str(&roff_example(
        "metrics_addr = \"0.0.0.0:9464\"\n\n[[policy]]\nname = \"inference-first\"\n\
         online = [\"pod-label:gpreempt.io/role=online\"]\noffline = [\"pod-label:gpreempt.io/role=offline\"]\n\
         offline_min_share = 0.1\nmax_suspend = \"2s\"",
    ));
    para(&mut p, "By the pods' names (globs):");
    p.push_str(&roff_example(
        "[[policy]]\nname = \"by-name\"\nonline = [\"pod:serving/llm-*\"]\noffline = [\"pod:batch/*\"]",
    ));
    para(&mut p, "By host pid (numbers or strings), then checked before it is applied:");
    p.push_str(&roff_example(
        "[[policy]]\nname = \"bench\"\nonline = [4242]\noffline = [5151, \"5152\"]\nidle = \"1ms\"",
    ));
    p.push_str(&roff_example(
        "$ gpreempt agent --check /etc/gpreempt/agent.toml\n/etc/gpreempt/agent.toml: valid, 1 policy: bench",
    ));
    p.push_str(".SH FILES\n");
    item(&mut p, "/etc/gpreempt/agent.toml", "The configuration the packaged systemd unit runs the agent with.");
    item(
        &mut p,
        "/usr/share/doc/gpreempt/docs/guide/agent.md",
        "The agent's guide; docs/guide/kubernetes.md for the DaemonSet.",
    );
    p.push_str(".SH SEE ALSO\n\\fBgpreempt\\-agent\\fR(1), \\fBgpreempt\\-schedule\\fR(1), \\fBgpreempt\\fR(1)\n");
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roff_escapes_what_it_would_read_as_requests() {
        assert_eq!(roff_escape("a-b \\x\n.TH x\n'c"), "a\\-b \\ex\n\\&.TH x\n\\&'c");
    }

    #[test]
    fn every_policy_setting_is_on_the_page_with_its_default() {
        let settings = policy_settings();
        let keys: Vec<&str> = settings.iter().map(|(k, _, _)| k.as_str()).collect();
        for key in ["idle", "poll", "max_suspend", "offline_min_share", "no_doorbell", "rt_priority"] {
            assert!(keys.contains(&key), "{keys:?}");
        }
        let idle = settings.iter().find(|(k, _, _)| k == "idle").unwrap();
        assert_eq!(idle.2.as_deref(), Some("2ms"));
        // Each key parses as a policy setting: the page names what the loader takes.
        for (key, _, default) in &settings {
            let Some(default) = default else { continue };
            let value = match default.parse::<f64>() {
                Ok(_) => default.clone(),
                Err(_) if default == "true" || default == "false" => default.clone(),
                Err(_) => format!("\"{default}\""),
            };
            let text = format!("[[policy]]\nname = \"a\"\nonline = [1]\noffline = [2]\n{key} = {value}\n");
            assert!(super::super::AgentConfig::parse(&text, "agent.toml").is_ok(), "{text}");
        }
        let page = config_page("0.1.0");
        assert!(page.starts_with(".TH GPREEMPT-AGENT.TOML 5 \"\" \"gpreempt 0.1.0\" \"File Formats\"\n"), "{page}");
        for key in keys {
            assert!(page.contains(&format!(".TP\n\\fB{}\\fR\n", roff_escape(key))), "{key}");
        }
        assert!(page.contains("\n.SH EXAMPLES\n"), "{page}");
        assert!(page.contains("\\-\\-check"), "{page}");
    }
}
