//! The user's own figures, taken from the load command's output with no change to it:
//! `--metric NAME=REGEX` (the regex's first capture group, or its whole match, read as a number)
//! or `--metric NAME=json:PATH` (a number at PATH in the output read as one JSON document or in
//! any of its lines read as JSON Lines). The last match in the output wins: load generators print
//! their summary last, after per-request or per-interval lines that may match too.

use std::{fmt, str::FromStr};

use regex::Regex;
use serde::{Serialize, Serializer};
use serde_json::Value;

/// Why a `--metric` cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetricError {
    #[error("--metric {0:?}: write NAME=REGEX or NAME=json:PATH (e.g. p99_ms='p99 ms ([0-9.]+)')")]
    NoName(String),
    #[error("--metric {0:?}: a name is letters, digits, `_`, `-` and `.` (it names a column and a JSON key)")]
    BadName(String),
    #[error("--metric {name}: the regex does not compile: {cause}")]
    BadRegex { name: String, cause: String },
    #[error("--metric {name}: the regex has {groups} capture groups; give at most one, around the number")]
    TooManyGroups { name: String, groups: usize },
    #[error(
        "--metric {name}: bad JSON path {path:?} at {at:?}: write keys separated by dots with [N] for an array \
         element (e.g. json:results.latency_ms.p99 or json:$.runs[0].p99)"
    )]
    BadPath { name: String, path: String, at: String },
    #[error("--metric {name}: it matched {text:?}, which is not a number; put the capture group around the number")]
    NotANumber { name: String, text: String },
}

/// One step of a JSON path.
#[derive(Clone, Debug, PartialEq, Eq)]
enum PathStep {
    Key(String),
    Index(usize),
}

#[derive(Clone, Debug)]
enum Source {
    Regex(Regex),
    Json(Vec<PathStep>),
}

/// One `--metric`: its name and where its number is in the load command's output.
#[derive(Clone, Debug)]
pub struct MetricSpec {
    pub name: String,
    /// As given after `NAME=` (the report and the errors quote it).
    pub pattern: String,
    source: Source,
}

impl PartialEq for MetricSpec {
    fn eq(&self, other: &Self) -> bool {
        (&self.name, &self.pattern) == (&other.name, &other.pattern)
    }
}

impl Serialize for MetricSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl fmt::Display for MetricSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.pattern)
    }
}

fn parse_path(name: &str, path: &str) -> Result<Vec<PathStep>, MetricError> {
    let bad = |at: &str| MetricError::BadPath { name: name.into(), path: path.into(), at: at.into() };
    let rest = path.strip_prefix('$').unwrap_or(path);
    let rest = rest.strip_prefix('.').unwrap_or(rest);
    if rest.is_empty() {
        return Err(bad(path));
    }
    let mut steps = Vec::new();
    for part in rest.split('.') {
        // `key`, `key[1]`, `key[1][2]`, or `[1]` after a dot.
        let (key, mut indices) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if key.is_empty() && indices.is_empty() {
            return Err(bad(part));
        }
        if !key.is_empty() {
            steps.push(PathStep::Key(key.to_owned()));
        }
        while !indices.is_empty() {
            let close = indices.find(']').ok_or_else(|| bad(part))?;
            let n = indices[1..close].trim().parse().map_err(|_| bad(part))?;
            steps.push(PathStep::Index(n));
            indices = &indices[close + 1..];
            if !indices.is_empty() && !indices.starts_with('[') {
                return Err(bad(part));
            }
        }
    }
    Ok(steps)
}

impl FromStr for MetricSpec {
    type Err = MetricError;

    fn from_str(s: &str) -> Result<Self, MetricError> {
        let (name, pattern) = s.split_once('=').ok_or_else(|| MetricError::NoName(s.into()))?;
        let name = name.trim();
        if name.is_empty() || pattern.is_empty() {
            return Err(MetricError::NoName(s.into()));
        }
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) {
            return Err(MetricError::BadName(name.into()));
        }
        let source = match pattern.strip_prefix("json:") {
            Some(path) => Source::Json(parse_path(name, path.trim())?),
            None => {
                let re = Regex::new(pattern)
                    .map_err(|e| MetricError::BadRegex { name: name.into(), cause: e.to_string() })?;
                // captures_len counts the whole match as group 0.
                let groups = re.captures_len() - 1;
                if groups > 1 {
                    return Err(MetricError::TooManyGroups { name: name.into(), groups });
                }
                Source::Regex(re)
            }
        };
        Ok(Self { name: name.to_owned(), pattern: pattern.to_owned(), source })
    }
}

/// A number as a load generator prints it: `12.5`, `1,234.5` (thousands separators), `-3e2`.
fn number(text: &str) -> Option<f64> {
    let t = text.trim();
    t.parse().ok().or_else(|| t.replace(',', "").parse().ok()).filter(|v: &f64| v.is_finite())
}

fn at_path<'v>(mut v: &'v Value, path: &[PathStep]) -> Option<&'v Value> {
    for step in path {
        v = match step {
            PathStep::Key(k) => v.get(k.as_str())?,
            PathStep::Index(i) => v.get(*i)?,
        };
    }
    Some(v)
}

fn json_number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => number(s),
        _ => None,
    }
}

impl MetricSpec {
    /// The metric's value in `output` (the last match), `None` when nothing matches.
    pub fn extract(&self, output: &str) -> Result<Option<f64>, MetricError> {
        match &self.source {
            Source::Regex(re) => {
                let Some(c) = re.captures_iter(output).last() else { return Ok(None) };
                let m = c.get(1).or_else(|| c.get(0));
                let text = m.map_or("", |m| m.as_str());
                number(text)
                    .map(Some)
                    .ok_or_else(|| MetricError::NotANumber { name: self.name.clone(), text: text.into() })
            }
            Source::Json(path) => {
                // The output as one document first (a pretty-printed report), then line by line
                // (JSON Lines); the last line that has the path wins.
                let whole = serde_json::from_str::<Value>(output).ok();
                let lines = output.lines().filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok());
                let mut found = None;
                for doc in whole.into_iter().chain(lines) {
                    if let Some(v) = at_path(&doc, path) {
                        found =
                            Some(json_number(v).ok_or_else(|| MetricError::NotANumber {
                                name: self.name.clone(),
                                text: v.to_string(),
                            })?);
                    }
                }
                Ok(found)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> MetricSpec {
        s.parse().unwrap()
    }

    #[test]
    fn vllm_benchmark_serving_output() {
        // benchmarks/benchmark_serving.py's result block (vLLM 0.6).
        let out = "============ Serving Benchmark Result ============\n\
                   Successful requests:                     200\n\
                   Benchmark duration (s):                  41.07\n\
                   Request throughput (req/s):              4.87\n\
                   ---------------Time to First Token----------------\n\
                   Mean TTFT (ms):                          52.31\n\
                   Median TTFT (ms):                        48.90\n\
                   P99 TTFT (ms):                           131.07\n\
                   -----Time per Output Token (excl. 1st token)------\n\
                   P99 TPOT (ms):                           22.45\n";
        assert_eq!(spec(r"ttft_p99_ms=P99 TTFT \(ms\):\s+([0-9.]+)").extract(out), Ok(Some(131.07)));
        assert_eq!(spec(r"req_per_s=Request throughput \(req/s\):\s+([0-9.]+)").extract(out), Ok(Some(4.87)));
        assert_eq!(spec(r"tpot=P99 TPOT \(ms\):\s+([0-9.]+)").extract(out), Ok(Some(22.45)));
    }

    #[test]
    fn triton_perf_analyzer_line_and_the_last_match_wins() {
        let out = "*** Measurement Settings ***\n\
                   Request concurrency: 4\n  Client:\n    Request count: 4210\n\
                   Inferences/Second vs. Client Average Batch Latency\n\
                   Concurrency: 2, throughput: 410.2 infer/sec, latency 4870 usec\n\
                   Concurrency: 4, throughput: 702.9 infer/sec, latency 5690 usec\n";
        let latency = spec(r"latency_us=Concurrency: \d+, throughput: [0-9.]+ infer/sec, latency ([0-9]+) usec");
        assert_eq!(latency.extract(out), Ok(Some(5690.0)));
        assert_eq!(spec(r"infer_per_s=throughput: ([0-9.]+) infer/sec").extract(out), Ok(Some(702.9)));
    }

    #[test]
    fn a_plain_p99_line_thousands_separators_and_a_whole_match() {
        assert_eq!(spec(r"p99_ms=p99 ms ([0-9.,]+)").extract("warmup\np99 ms 1,204.5\n"), Ok(Some(1204.5)));
        assert_eq!(spec(r"p99_ms=p99_ms=([0-9.]+)").extract("requests=10 p99_ms=12.75\n"), Ok(Some(12.75)));
        // No group: the whole match is the number.
        assert_eq!(spec(r"n=[0-9]+").extract("abc 42 def 7"), Ok(Some(7.0)));
        assert_eq!(spec(r"p99=p99 ms ([0-9.]+)").extract("nothing here"), Ok(None));
        assert_eq!(
            spec(r"p99=p99 ms (\S+)").extract("p99 ms n/a"),
            Err(MetricError::NotANumber { name: "p99".into(), text: "n/a".into() })
        );
    }

    #[test]
    fn json_paths_in_a_document_and_in_json_lines() {
        let doc = r#"{"summary": {"latency_ms": {"p99": 9.5}}, "runs": [{"p99": 1}, {"p99": "2.5"}]}"#;
        assert_eq!(spec("p=json:summary.latency_ms.p99").extract(doc), Ok(Some(9.5)));
        assert_eq!(spec("p=json:$.runs[1].p99").extract(doc), Ok(Some(2.5)));
        assert_eq!(spec("p=json:runs[0].p99").extract(doc), Ok(Some(1.0)));
        assert_eq!(spec("p=json:runs[2].p99").extract(doc), Ok(None));
        let lines = "{\"event\":\"request\",\"latency_ns\":5}\nnot json\n{\"event\":\"summary\",\"latency_ns\":{\"p99\":700}}\n{\"event\":\"bye\"}\n";
        assert_eq!(spec("p=json:latency_ns.p99").extract(lines), Ok(Some(700.0)));
        assert_eq!(
            spec("p=json:event").extract(lines),
            Err(MetricError::NotANumber { name: "p".into(), text: "\"request\"".into() })
        );
    }

    #[test]
    fn bad_specs_are_refused_with_the_fix() {
        let err = |s: &str| s.parse::<MetricSpec>().unwrap_err();
        assert_eq!(err("p99"), MetricError::NoName("p99".into()));
        assert_eq!(err("=x"), MetricError::NoName("=x".into()));
        assert_eq!(err("p 99=x"), MetricError::BadName("p 99".into()));
        assert!(matches!(err("p=(unclosed"), MetricError::BadRegex { .. }));
        assert_eq!(err("p=(a)(b)"), MetricError::TooManyGroups { name: "p".into(), groups: 2 });
        assert!(matches!(err("p=json:a..b"), MetricError::BadPath { .. }));
        assert!(matches!(err("p=json:a[x]"), MetricError::BadPath { .. }));
        assert!(matches!(err("p=json:$"), MetricError::BadPath { .. }));
        assert_eq!(spec("a.b-c_1=x").name, "a.b-c_1");
        assert_eq!(spec("p99=p99 ms ([0-9.]+)").to_string(), "p99=p99 ms ([0-9.]+)");
        assert!(err("p=(a)(b)").to_string().contains("at most one"));
    }
}
