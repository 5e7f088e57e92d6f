//! `pod-label:KEY=VALUE[,KEY2!=VALUE2…]`: the pods whose labels satisfy a Kubernetes
//! equality-based label selector, as kubectl writes them (`kubectl get pods -l
//! 'gpreempt.io/role=offline,tier!=canary'`): `=` and `==` (the label is there with that value),
//! `!=` (the label is absent or has another value), a comma between requirements meaning AND
//! (kubernetes.io, "Labels and Selectors", "Equality-based requirement"). Set-based requirements
//! (`in`, `notin`, `!key`, a bare `key`) are refused with that said.
//!
//! Keys and values are checked as the API server checks labels (k8s.io/apimachinery
//! `pkg/util/validation/validation.go`, `IsQualifiedName` and `IsValidLabelValue`): a key is an
//! optional DNS-subdomain prefix (at most 253 characters) and `/`, then a name of at most 63
//! characters; a name or a value is alphanumeric at both ends with `-`, `_`, `.` between, and a
//! value may be empty. A selector that no label could satisfy is a mistake the user should hear
//! about at once, not a policy that silently never matches.
//!
//! The pods are answered by the node's CRI runtime ([`crate::host::cri`]): ListPodSandbox with the
//! `=` requirements as its label filter (the runtime ANDs them), the `!=` ones checked here, then
//! the pods' containers.

use std::{
    collections::{HashMap, HashSet},
    fmt,
    str::FromStr,
};

use serde::Serialize;

use crate::host::cri::{CriClient, CriError, CriSocket};

/// The prefix of a label selector.
pub const POD_LABEL_PREFIX: &str = "pod-label:";

/// What to write, for the errors.
const SYNTAX: &str = "write pod-label:KEY=VALUE[,KEY2=VALUE2,KEY3!=VALUE3] (kubectl's equality-based selector, \
                      e.g. pod-label:gpreempt.io/role=offline)";

/// How a requirement compares the label's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LabelOp {
    /// `=` or `==`: the label is present with this value.
    Equals,
    /// `!=`: the label is absent or has another value.
    NotEquals,
}

/// One `KEY=VALUE` or `KEY!=VALUE`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct LabelRequirement {
    pub key: String,
    pub op: LabelOp,
    pub value: String,
}

/// A parsed `pod-label:` selector: every requirement must hold.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct PodLabelSelector {
    pub requirements: Vec<LabelRequirement>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PodLabelError {
    #[error("`{0}` names no label: {SYNTAX}")]
    Empty(String),
    #[error("`{selector}`: `{requirement}` has no `=`, `==` or `!=`; {SYNTAX}")]
    NoOperator { selector: String, requirement: String },
    #[error(
        "`{selector}`: `{requirement}` is a set-based requirement (in, notin, exists), which gpreempt does not take; {SYNTAX}"
    )]
    SetBased { selector: String, requirement: String },
    #[error("`{selector}`: label key `{key}` {why}; {SYNTAX}")]
    Key { selector: String, key: String, why: &'static str },
    #[error("`{selector}`: label value `{value}` {why}; {SYNTAX}")]
    Value { selector: String, value: String, why: &'static str },
}

impl FromStr for PodLabelSelector {
    type Err = PodLabelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let selector = s.trim();
        let rest = selector.strip_prefix(POD_LABEL_PREFIX).unwrap_or(selector);
        if rest.trim().is_empty() {
            return Err(PodLabelError::Empty(selector.into()));
        }
        let requirements =
            rest.split(',').map(|part| requirement(selector, part.trim())).collect::<Result<Vec<_>, _>>()?;
        Ok(Self { requirements })
    }
}

fn requirement(selector: &str, part: &str) -> Result<LabelRequirement, PodLabelError> {
    let no_op = || PodLabelError::NoOperator { selector: selector.into(), requirement: part.into() };
    if part.is_empty() {
        return Err(PodLabelError::Empty(selector.into()));
    }
    let (key, op, value) = if let Some((k, v)) = part.split_once("!=") {
        (k, LabelOp::NotEquals, v)
    } else if let Some((k, v)) = part.split_once("==") {
        (k, LabelOp::Equals, v)
    } else if let Some((k, v)) = part.split_once('=') {
        (k, LabelOp::Equals, v)
    } else {
        let set_based = part.starts_with('!')
            || part.contains(" in ")
            || part.contains(" notin ")
            || part.contains('(')
            || is_key(part).is_ok();
        return Err(if set_based {
            PodLabelError::SetBased { selector: selector.into(), requirement: part.into() }
        } else {
            no_op()
        });
    };
    let (key, value) = (key.trim(), value.trim());
    if value.starts_with('=') {
        return Err(no_op());
    }
    is_key(key).map_err(|why| PodLabelError::Key { selector: selector.into(), key: key.into(), why })?;
    is_value(value).map_err(|why| PodLabelError::Value { selector: selector.into(), value: value.into(), why })?;
    Ok(LabelRequirement { key: key.into(), op, value: value.into() })
}

/// gRPC's NOT_FOUND status code (grpc/grpc `doc/statuscodes.md`).
const GRPC_NOT_FOUND: u32 = 5;

/// The longest label name or value (apimachinery `LabelValueMaxLength`, `qualifiedNameMaxLength`).
const NAME_MAX: usize = 63;
/// The longest key prefix (apimachinery `DNS1123SubdomainMaxLength`).
const PREFIX_MAX: usize = 253;

fn is_key(key: &str) -> Result<(), &'static str> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Err("has an empty prefix before `/`");
        }
        if prefix.len() > PREFIX_MAX {
            return Err("has a prefix longer than 253 characters");
        }
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if !prefix.split('.').all(label_ok) {
            return Err("has a prefix that is not a DNS subdomain (lowercase letters, digits, `-`, `.`)");
        }
    }
    if name.is_empty() {
        return Err("has an empty name");
    }
    if name.contains('/') {
        return Err("has more than one `/`");
    }
    if name.len() > NAME_MAX {
        return Err("has a name longer than 63 characters");
    }
    if !is_name(name) {
        return Err("must begin and end with a letter or digit, with only `-`, `_`, `.` or alphanumerics between");
    }
    Ok(())
}

fn is_value(value: &str) -> Result<(), &'static str> {
    if value.len() > NAME_MAX {
        return Err("is longer than 63 characters");
    }
    if !value.is_empty() && !is_name(value) {
        return Err(
            "must be empty or begin and end with a letter or digit, with only `-`, `_`, `.` or alphanumerics between",
        );
    }
    Ok(())
}

/// apimachinery's `qualifiedNameFmt`: `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
fn is_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    let alnum = |b: &u8| b.is_ascii_alphanumeric();
    bytes.first().is_some_and(alnum)
        && bytes.last().is_some_and(alnum)
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(b))
}

impl fmt::Display for PodLabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(POD_LABEL_PREFIX)?;
        for (i, r) in self.requirements.iter().enumerate() {
            let op = match r.op {
                LabelOp::Equals => "=",
                LabelOp::NotEquals => "!=",
            };
            write!(f, "{}{}{op}{}", if i == 0 { "" } else { "," }, r.key, r.value)?;
        }
        Ok(())
    }
}

impl PodLabelSelector {
    /// Do a pod's labels satisfy every requirement?
    pub fn matches(&self, labels: &HashMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r.op {
            LabelOp::Equals => labels.get(&r.key) == Some(&r.value),
            LabelOp::NotEquals => labels.get(&r.key) != Some(&r.value),
        })
    }

    /// The `=` requirements, as CRI's `label_selector` filter takes them.
    pub fn equalities(&self) -> HashMap<String, String> {
        self.requirements.iter().filter(|r| r.op == LabelOp::Equals).map(|r| (r.key.clone(), r.value.clone())).collect()
    }

    /// Could some pod satisfy both `self` and `other`? Not when one asks a key for a value the
    /// other asks for another value, or refuses.
    pub fn can_meet(&self, other: &Self) -> bool {
        !self.requirements.iter().any(|a| {
            other.requirements.iter().any(|b| {
                a.key == b.key
                    && match (a.op, b.op) {
                        (LabelOp::Equals, LabelOp::Equals) => a.value != b.value,
                        (LabelOp::Equals, LabelOp::NotEquals) | (LabelOp::NotEquals, LabelOp::Equals) => {
                            a.value == b.value
                        }
                        (LabelOp::NotEquals, LabelOp::NotEquals) => false,
                    }
            })
        })
    }

    /// The ids of the containers (and of the pods' sandboxes) of every pod the runtime at
    /// `socket` runs whose labels satisfy the selector.
    pub fn containers(&self, socket: &CriSocket) -> Result<HashSet<String>, CriError> {
        let mut client = CriClient::connect(socket)?;
        self.containers_with(&mut client)
    }

    pub fn containers_with(&self, client: &mut CriClient) -> Result<HashSet<String>, CriError> {
        let pods: HashSet<String> = client
            .pods_labelled(self.equalities())?
            .into_iter()
            .filter(|p| self.matches(&p.labels))
            .map(|p| p.id)
            .collect();
        if pods.is_empty() {
            return Ok(HashSet::new());
        }
        let mut ids: HashSet<String> =
            client.containers(None)?.into_iter().filter(|c| pods.contains(&c.pod_sandbox_id)).map(|c| c.id).collect();
        ids.extend(pods);
        Ok(ids)
    }

    /// Is the container `id` in a pod the selector names? One container's lookup, for a process
    /// that has just opened `/dev/kfd`: its pod, then that pod's labels.
    pub fn takes_container(&self, client: &mut CriClient, id: &str) -> Result<bool, CriError> {
        let Some(container) = client.container(id)? else {
            return Ok(false);
        };
        match client.pod_status(&container.pod_sandbox_id) {
            Ok(status) => Ok(status.is_some_and(|s| self.matches(&s.labels))),
            // NOT_FOUND: the pod went away between the two calls; its processes are leaving too.
            Err(e) if e.grpc_code() == Some(GRPC_NOT_FOUND) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<PodLabelSelector, PodLabelError> {
        s.parse()
    }

    fn req(key: &str, op: LabelOp, value: &str) -> LabelRequirement {
        LabelRequirement { key: key.into(), op, value: value.into() }
    }

    #[test]
    fn parses_kubectls_equality_based_syntax() {
        use LabelOp::{Equals, NotEquals};
        assert_eq!(
            parse("pod-label:gpreempt.io/role=offline").unwrap().requirements,
            [req("gpreempt.io/role", Equals, "offline")]
        );
        assert_eq!(
            parse("pod-label: app==trainer , tier!=canary,track=").unwrap().requirements,
            [req("app", Equals, "trainer"), req("tier", NotEquals, "canary"), req("track", Equals, "")]
        );
        assert_eq!(
            parse("pod-label:a.b-c.example/N_a.m-e=V.1_x").unwrap().requirements,
            [req("a.b-c.example/N_a.m-e", Equals, "V.1_x")]
        );
        // Written back as kubectl would take it (`==` as `=`).
        assert_eq!(parse("pod-label:app==x,b!=y").unwrap().to_string(), "pod-label:app=x,b!=y");
        let longest = "k".repeat(63);
        assert!(parse(&format!("pod-label:{longest}={longest}")).is_ok());
    }

    #[test]
    fn refuses_what_kubectl_would_refuse_with_the_syntax() {
        let syntax = "write pod-label:KEY=VALUE[,KEY2=VALUE2,KEY3!=VALUE3] (kubectl's equality-based selector, \
                      e.g. pod-label:gpreempt.io/role=offline)";
        assert_eq!(parse("pod-label:").unwrap_err().to_string(), format!("`pod-label:` names no label: {syntax}"));
        assert_eq!(parse("pod-label:a=b,"), Err(PodLabelError::Empty("pod-label:a=b,".into())));
        assert_eq!(
            parse("pod-label:role").unwrap_err().to_string(),
            format!(
                "`pod-label:role`: `role` is a set-based requirement (in, notin, exists), which gpreempt does not take; {syntax}"
            )
        );
        assert_eq!(
            parse("pod-label:!role"),
            Err(PodLabelError::SetBased { selector: "pod-label:!role".into(), requirement: "!role".into() })
        );
        assert_eq!(
            parse("pod-label:env in (a b)"),
            Err(PodLabelError::SetBased {
                selector: "pod-label:env in (a b)".into(),
                requirement: "env in (a b)".into()
            })
        );
        assert_eq!(
            parse("pod-label:role:online"),
            Err(PodLabelError::NoOperator {
                selector: "pod-label:role:online".into(),
                requirement: "role:online".into()
            })
        );
        assert_eq!(
            parse("pod-label:a===b"),
            Err(PodLabelError::NoOperator { selector: "pod-label:a===b".into(), requirement: "a===b".into() })
        );
        assert_eq!(
            parse("pod-label:=x").unwrap_err().to_string(),
            format!("`pod-label:=x`: label key `` has an empty name; {syntax}")
        );
        let key_err = |s: &str| match parse(s) {
            Err(PodLabelError::Key { why, .. }) => why,
            other => panic!("{s}: {other:?}"),
        };
        assert_eq!(key_err("pod-label:/role=x"), "has an empty prefix before `/`");
        assert_eq!(key_err("pod-label:a/b/c=x"), "has more than one `/`");
        assert_eq!(
            key_err("pod-label:Gpreempt.io/role=x"),
            "has a prefix that is not a DNS subdomain (lowercase letters, digits, `-`, `.`)"
        );
        assert_eq!(key_err(&format!("pod-label:{}=x", "k".repeat(64))), "has a name longer than 63 characters");
        assert_eq!(key_err(&format!("pod-label:{}/k=x", "a".repeat(254))), "has a prefix longer than 253 characters");
        assert_eq!(
            key_err("pod-label:-role=x"),
            "must begin and end with a letter or digit, with only `-`, `_`, `.` or alphanumerics between"
        );
        assert_eq!(
            parse("pod-label:role=on line").unwrap_err().to_string(),
            format!(
                "`pod-label:role=on line`: label value `on line` must be empty or begin and end with a letter or digit, \
                 with only `-`, `_`, `.` or alphanumerics between; {syntax}"
            )
        );
        assert_eq!(
            parse(&format!("pod-label:role={}", "v".repeat(64))),
            Err(PodLabelError::Value {
                selector: format!("pod-label:role={}", "v".repeat(64)),
                value: "v".repeat(64),
                why: "is longer than 63 characters"
            })
        );
    }

    #[test]
    fn matches_labels_as_the_api_server_does() {
        let labels = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
        };
        let sel = parse("pod-label:gpreempt.io/role=offline,tier!=canary").unwrap();
        assert!(sel.matches(&labels(&[("gpreempt.io/role", "offline")])));
        assert!(sel.matches(&labels(&[("gpreempt.io/role", "offline"), ("tier", "prod")])));
        assert!(!sel.matches(&labels(&[("gpreempt.io/role", "offline"), ("tier", "canary")])));
        assert!(!sel.matches(&labels(&[("gpreempt.io/role", "online")])));
        assert!(!sel.matches(&labels(&[])));
        // `!=` alone takes a pod without the label.
        assert!(parse("pod-label:tier!=canary").unwrap().matches(&labels(&[])));
        // An empty value asks for the label present and empty.
        assert!(parse("pod-label:x=").unwrap().matches(&labels(&[("x", "")])));
        assert!(!parse("pod-label:x=").unwrap().matches(&labels(&[])));
        assert_eq!(sel.equalities(), labels(&[("gpreempt.io/role", "offline")]));
    }

    #[test]
    fn two_selectors_meet_unless_a_key_contradicts() {
        let p = |s: &str| parse(s).unwrap();
        assert!(!p("pod-label:role=online").can_meet(&p("pod-label:role=offline")));
        assert!(!p("pod-label:role=online").can_meet(&p("pod-label:role!=online,app=x")));
        assert!(p("pod-label:role=online").can_meet(&p("pod-label:app=x")));
        assert!(p("pod-label:role=online").can_meet(&p("pod-label:role=online")));
        assert!(p("pod-label:role!=a").can_meet(&p("pod-label:role!=b")));
        assert!(p("pod-label:role=a").can_meet(&p("pod-label:role!=b")));
    }
}
