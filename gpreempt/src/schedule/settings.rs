//! Every setting of the scheduler a user tunes, as one type: `gpreempt schedule`'s flags,
//! `gpreempt evaluate`'s scheduled state and the agent's `[[policy]]` tables all parse into
//! [`SchedulerSettings`], with one name (the flag `--max-suspend` is the key `max_suspend`), one
//! unit syntax (a number and a unit: `5s`, `200us`; [`crate::duration`]) and one default.

use std::{fmt, time::Duration};

use serde::{Deserialize, Deserializer, de};

use super::{
    arrival::patterns::{ANY, Prefix},
    config::{ArrivalConfig, DEFAULT_RT_PRIORITY, ScheduleConfig},
    policy::{DEFAULT_BUSY_SHARE, PolicyConfig},
    realtime::RealtimeConfig,
    runnable::Runnable,
    wake_latency::WakeLatency,
};
use crate::{duration, host::select::Selector};

/// How the scheduler runs: its policy, its reaction thread and what it uses to see online work.
#[derive(Clone, Debug, PartialEq, clap::Args, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerSettings {
    /// Resume the offline queues after the online processes have been idle this long (e.g. 2ms,
    /// 500us). Where it starts: the threshold is then learnt per GPU from every online gap (see
    /// --fixed-idle).
    #[arg(long, default_value = "2ms", value_parser = duration::with_unit("ms"), value_name = "DURATION")]
    #[serde(deserialize_with = "in_ms")]
    pub idle: Duration,
    /// Keep --idle as it is given instead of learning the threshold from the gaps between the
    /// online work's bursts (the valley between gaps inside a request and gaps between requests).
    #[arg(long)]
    pub fixed_idle: bool,
    /// Interval between the reaction thread's steps (reads of the online dispatch indices), e.g.
    /// 200us.
    #[arg(long, default_value = "200us", value_parser = duration::with_unit("us"), value_name = "DURATION")]
    #[serde(deserialize_with = "in_us")]
    pub poll: Duration,
    /// SCHED_FIFO priority of the reaction thread (1-99; 0: normal scheduling). Without
    /// CAP_SYS_NICE it is said once and the thread runs at normal priority.
    #[arg(long, default_value_t = DEFAULT_RT_PRIORITY, value_name = "N",
          value_parser = clap::value_parser!(u8).range(0..=99))]
    #[serde(deserialize_with = "priority")]
    pub rt_priority: u8,
    /// Pin the reaction thread to this CPU (give it one no other busy task uses).
    #[arg(long, value_name = "CPU")]
    pub cpu: Option<usize>,
    /// The reaction thread polls without sleeping between steps: the shortest detection, at the
    /// cost of one CPU kept busy (for hosts with a core to spare; combine with --cpu).
    #[arg(long)]
    pub busy_poll: bool,
    /// Do not lock gpreempt's memory (mlockall) against page faults in the reaction thread.
    #[arg(long)]
    pub no_mlock: bool,
    /// How quickly an idle CPU must wake for the reaction thread, held as a CPU latency PM QoS
    /// request (/dev/cpu_dma_latency) while the scheduler runs and dropped by the kernel when
    /// gpreempt exits, however it exits. auto: 0 (idle CPUs poll) in a KVM guest with the
    /// haltpoll idle driver, where a halted vCPU waits for the host to wake it; 10us elsewhere,
    /// which keeps C1 and excludes the deep C-states. A duration: that limit (e.g. 0us, 20us).
    /// off: the idle states as the host has them. The cost is power on idle CPUs.
    #[arg(long, default_value = "auto", value_name = "auto|off|DURATION")]
    pub cpu_wake_latency: WakeLatency,
    /// Do not use the doorbell probe (eBPF uprobes on the libhsa-runtime64 each online process
    /// maps, which see a submission the moment the runtime rings the queue's doorbell): poll the
    /// online dispatch indices every --poll instead, also while the online side is idle.
    #[arg(long)]
    pub no_doorbell: bool,
    /// Do not use the arrival probe (an eBPF cgroup_skb ingress program on each online process's
    /// cgroup v2, which sees a request reach the process's listening TCP port before its first
    /// kernel): the offline side is then suspended when the request's GPU work is seen.
    #[arg(long)]
    pub no_arrival: bool,
    /// The online service's request port (repeat for several): arrivals are watched on these
    /// only. Default: every TCP port each online process listens on, found from its sockets and
    /// refreshed.
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    #[serde(deserialize_with = "ports")]
    pub arrival_port: Vec<u16>,
    /// A request's first bytes (repeat for several; replaces the default list `POST `,
    /// `h2:preface`, `h2:headers`): text matched as a prefix with the escapes \r \n \t \\
    /// \xNN, `h2:preface` (an HTTP/2 connection preface), `h2:headers` (an HTTP/2 HEADERS frame),
    /// or `any` (every payload no deny pattern matches: for TLS or protocols no pattern fits).
    #[arg(long, value_name = "PATTERN", value_parser = parse_pattern)]
    #[serde(deserialize_with = "patterns")]
    pub arrival_allow: Vec<String>,
    /// First bytes that are no request, checked before the allow list (repeat for several;
    /// replaces the default list `GET /health`, `GET /metrics`, `GET /ready`, `GET /v1/models`).
    #[arg(long, value_name = "PATTERN", value_parser = parse_pattern)]
    #[serde(deserialize_with = "patterns")]
    pub arrival_deny: Vec<String>,
    /// While the reaction thread waits on the doorbell probe, read the online indices this often
    /// anyway (work that bypasses the runtime's export: its internal blits, a raw write), e.g. 10ms.
    #[arg(long, default_value = "10ms", value_parser = duration::with_unit("ms"), value_name = "DURATION")]
    #[serde(deserialize_with = "in_ms")]
    pub cross_check: Duration,
    /// Resume after every idle gap of --idle, even one predicted shorter than what the resume
    /// and the next suspend cost the online job (by default such resumes are skipped).
    #[arg(long)]
    pub no_cost_aware: bool,
    /// Interval between reads of the online processes' cu_occupancy while nothing else asks for
    /// one, e.g. 10ms. Submissions are seen in the queues' write indices and a fresh read precedes
    /// every idle resume; the periodic read backs up queues that are not watched (no tracer).
    #[arg(long, default_value = "10ms", value_parser = duration::with_unit("us"), value_name = "DURATION")]
    #[serde(deserialize_with = "in_us")]
    pub occupancy: Duration,
    /// Guarantee the offline job this share of GPU time over --share-window even under
    /// continuous online load (0..1; 0: none). The online work waits during those slices.
    #[arg(long, default_value_t = 0.0, value_name = "F", value_parser = parse_share)]
    #[serde(deserialize_with = "share")]
    pub offline_min_share: f64,
    /// The window over which --offline-min-share is guaranteed, e.g. 1s.
    #[arg(long, default_value = "1s", value_parser = duration::with_unit("ms"), value_name = "DURATION")]
    #[serde(deserialize_with = "in_ms")]
    pub share_window: Duration,
    /// Resume (watchdog) a suspension that lasts longer than this, e.g. 5s.
    #[arg(long, default_value = "5s", value_parser = duration::with_unit("ms"), value_name = "DURATION")]
    #[serde(deserialize_with = "in_ms")]
    pub max_suspend: Duration,
    /// The offline job's share of the GPU while online work stays busy past --max-suspend: after
    /// each watchdog resume it runs max-suspend × F / (1 − F), then the online work is protected
    /// again (0..0.5; 0: unprotected until the online work goes idle).
    #[arg(long, default_value_t = DEFAULT_BUSY_SHARE, value_name = "F", value_parser = parse_busy_share)]
    #[serde(deserialize_with = "busy_share")]
    pub busy_share: f64,
    /// Hold an offline process that has nothing on the GPU (its queues there drained, no wave in
    /// flight) with no ioctl, and suspend it at its first submission within the hold: fewer
    /// device-wide unmaps and more offline throughput, at the cost of a late suspend inside the
    /// online work when it submits (by default every offline process with queues there is
    /// suspended at once).
    #[arg(long)]
    pub defer_idle_offline: bool,
    /// Hold each offline job on all of its GPUs or on none: the processes of one --offline
    /// container or pod, or all the pids given, are suspended on every GPU they use whenever any
    /// GPU they share with online work is held (a data-parallel job stalls at its next
    /// collective anyway).
    #[arg(long)]
    pub gang: bool,
    /// How many offline processes run on a GPU while it has no online work, the others
    /// suspended ("parked") and taking turns every --rotate: each online burst then pays that
    /// many SUSPENDs instead of one per offline process. auto: all at first, one fewer each time
    /// those running are seen to keep the GPU busy by themselves (compute-bound trainers), one
    /// more when they leave it idle (loader-bound ones), learnt per GPU; all (or 0): every
    /// offline process; N: at most N. Not with --gang (a job's ranks run together).
    #[arg(long, default_value = "auto", value_name = "auto|all|N")]
    pub runnable: Runnable,
    /// How often parked offline processes take their turn (--runnable), e.g. 250ms.
    #[arg(long, default_value = "250ms", value_parser = duration::with_unit("ms"), value_name = "DURATION")]
    #[serde(deserialize_with = "in_ms")]
    pub rotate: Duration,
}

impl Default for SchedulerSettings {
    /// The same values as the flags' defaults (a unit test holds them together).
    fn default() -> Self {
        let config = ScheduleConfig::default();
        Self {
            idle: config.policy.idle,
            fixed_idle: !config.policy.learn_idle,
            poll: config.poll,
            rt_priority: config.realtime.priority,
            cpu: config.realtime.cpu,
            busy_poll: config.busy_poll,
            no_mlock: !config.realtime.lock_memory,
            cpu_wake_latency: config.realtime.wake_latency,
            no_doorbell: !config.doorbell,
            no_arrival: config.arrival.is_none(),
            arrival_port: Vec::new(),
            arrival_allow: Vec::new(),
            arrival_deny: Vec::new(),
            cross_check: config.cross_check,
            no_cost_aware: !config.policy.cost_aware,
            occupancy: config.occupancy,
            offline_min_share: config.policy.min_share,
            share_window: config.policy.share_window,
            max_suspend: config.policy.max_suspend,
            busy_share: config.policy.busy_share,
            defer_idle_offline: config.defer_idle,
            gang: config.gang,
            runnable: config.runnable,
            rotate: config.rotate,
        }
    }
}

impl SchedulerSettings {
    /// The scheduler's configuration for these processes with these settings; what is not a
    /// setting (interval records, hint socket, roots, session options) as
    /// [`ScheduleConfig::default`] has it.
    pub fn config(&self, online: Vec<Selector>, offline: Vec<Selector>) -> ScheduleConfig {
        ScheduleConfig {
            online,
            offline,
            policy: PolicyConfig {
                idle: self.idle,
                max_suspend: self.max_suspend,
                min_share: self.offline_min_share,
                // A zero window would divide the share by nothing.
                share_window: self.share_window.max(Duration::from_millis(1)),
                cost_aware: !self.no_cost_aware,
                busy_share: self.busy_share,
                learn_idle: !self.fixed_idle,
            },
            poll: self.poll,
            busy_poll: self.busy_poll,
            realtime: RealtimeConfig {
                priority: self.rt_priority,
                cpu: self.cpu,
                lock_memory: !self.no_mlock,
                wake_latency: self.cpu_wake_latency,
            },
            occupancy: self.occupancy,
            doorbell: !self.no_doorbell,
            arrival: (!self.no_arrival).then(|| ArrivalConfig {
                ports: self.arrival_port.clone(),
                allow: self.arrival_allow.clone(),
                deny: self.arrival_deny.clone(),
            }),
            cross_check: self.cross_check,
            defer_idle: self.defer_idle_offline,
            gang: self.gang,
            runnable: self.runnable,
            rotate: self.rotate.max(Duration::from_millis(1)),
            ..ScheduleConfig::default()
        }
    }
}

/// `--offline-min-share`: a share in [0, 1).
pub fn parse_share(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) => check_share(v),
        Err(_) => Err(format!("`{s}` is not a share in [0, 1) (e.g. 0.2 for 20 %)")),
    }
}

fn check_share(v: f64) -> Result<f64, String> {
    if (0.0..1.0).contains(&v) { Ok(v) } else { Err(format!("`{v}` is not a share in [0, 1) (e.g. 0.2 for 20 %)")) }
}

/// `--busy-share`: a share in [0, 0.5].
pub fn parse_busy_share(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) => check_busy_share(v),
        Err(_) => Err(busy_share_error(s)),
    }
}

fn check_busy_share(v: f64) -> Result<f64, String> {
    if (0.0..=0.5).contains(&v) { Ok(v) } else { Err(busy_share_error(&v.to_string())) }
}

fn busy_share_error(s: &str) -> String {
    format!("`{s}` is not a share in [0, 0.5] (e.g. 0.05 for 5 % of a long online busy period)")
}

/// `--arrival-allow` / `--arrival-deny`: one pattern, checked as the probe will compile it.
pub fn parse_pattern(s: &str) -> Result<String, String> {
    if s == ANY {
        return Ok(s.into());
    }
    Prefix::parse(s).map(|_| s.to_owned()).map_err(|e| e.to_string())
}

fn patterns<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let list = Vec::<String>::deserialize(d)
        .map_err(|_| de::Error::custom("write arrival patterns as a list of strings, e.g. [\"POST \"]"))?;
    for p in &list {
        parse_pattern(p).map_err(de::Error::custom)?;
    }
    Ok(list)
}

fn ports<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u16>, D::Error> {
    let list = Vec::<i64>::deserialize(d)
        .map_err(|_| de::Error::custom("write arrival ports as a list of numbers, e.g. [8000]"))?;
    list.into_iter()
        .map(|p| {
            u16::try_from(p)
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| de::Error::custom(format!("`{p}` is not a TCP port (1-65535)")))
        })
        .collect()
}

// The configuration file's forms: durations as strings with a unit, the same parser as the flags.

fn in_unit<'de, D: Deserializer<'de>>(d: D, hint: &str) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)
        .map_err(|_| de::Error::custom(format!("write a duration as a string with a unit, e.g. \"20{hint}\"")))?;
    duration::parse(&text, hint).map_err(de::Error::custom)
}

fn in_ms<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    in_unit(d, "ms")
}

fn in_us<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    in_unit(d, "us")
}

/// A number, integer or not (TOML's `0` is an integer).
struct Number;

impl de::Visitor<'_> for Number {
    type Value = f64;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a number")
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
        Ok(v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
        Ok(v as f64)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
        Ok(v as f64)
    }
}

fn share<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    check_share(d.deserialize_any(Number)?).map_err(de::Error::custom)
}

fn busy_share<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    check_busy_share(d.deserialize_any(Number)?).map_err(de::Error::custom)
}

fn priority<'de, D: Deserializer<'de>>(d: D) -> Result<u8, D::Error> {
    let v = d.deserialize_any(Number)?;
    if (0.0..=99.0).contains(&v) && v.fract() == 0.0 {
        Ok(v as u8)
    } else {
        Err(de::Error::custom(format!("`{v}` is not a SCHED_FIFO priority in 0..=99 (0: normal scheduling)")))
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        settings: SchedulerSettings,
    }

    #[test]
    fn the_flags_defaults_are_the_types_and_the_schedulers() {
        let flags = Flags::try_parse_from(["gpreempt"]).unwrap();
        assert_eq!(flags.settings, SchedulerSettings::default());
        let config = SchedulerSettings::default().config(Vec::new(), Vec::new());
        let default = ScheduleConfig::default();
        assert_eq!(config.policy, default.policy);
        assert_eq!(
            (config.poll, config.busy_poll, config.occupancy, config.doorbell, config.cross_check, config.defer_idle),
            (
                default.poll,
                default.busy_poll,
                default.occupancy,
                default.doorbell,
                default.cross_check,
                default.defer_idle
            )
        );
        assert_eq!((config.gang, config.runnable, config.rotate), (default.gang, default.runnable, default.rotate));
        assert_eq!(
            (config.realtime.priority, config.realtime.cpu, config.realtime.lock_memory, config.realtime.wake_latency),
            (DEFAULT_RT_PRIORITY, None, true, WakeLatency::Auto)
        );
    }

    /// Every flag is a key of the configuration file under the same name (`-` as `_`), and the
    /// same value written in each gives the same settings.
    #[test]
    fn every_flag_is_a_key_with_the_same_meaning() {
        let values = [
            ("idle", "500us"),
            ("fixed-idle", ""),
            ("poll", "100us"),
            ("rt-priority", "30"),
            ("cpu", "1"),
            ("busy-poll", ""),
            ("no-mlock", ""),
            ("cpu-wake-latency", "20us"),
            ("no-doorbell", ""),
            ("no-arrival", ""),
            ("arrival-port", "[8000]"),
            ("arrival-allow", "[\"POST \"]"),
            ("arrival-deny", "[\"GET /x\"]"),
            ("cross-check", "20ms"),
            ("no-cost-aware", ""),
            ("occupancy", "5ms"),
            ("offline-min-share", "0.25"),
            ("share-window", "2s"),
            ("max-suspend", "900ms"),
            ("busy-share", "0.1"),
            ("defer-idle-offline", ""),
            ("gang", ""),
            ("runnable", "2"),
            ("rotate", "100ms"),
        ];
        let flags: Vec<String> =
            Flags::command().get_arguments().filter_map(|a| a.get_long().map(String::from)).collect();
        assert_eq!(
            flags,
            values.iter().map(|(f, _)| f.to_string()).collect::<Vec<_>>(),
            "a setting without a case here"
        );
        let mut args = vec!["gpreempt".to_string()];
        let mut toml = String::new();
        for (flag, value) in values {
            args.push(format!("--{flag}"));
            let key = flag.replace('-', "_");
            match value {
                "" => toml.push_str(&format!("{key} = true\n")),
                v if v.starts_with('[') => {
                    let item = v.trim_matches(['[', ']']).trim_matches('"');
                    args.push(item.into());
                    toml.push_str(&format!("{key} = {v}\n"));
                }
                v if v.ends_with('s') => {
                    args.push(v.into());
                    toml.push_str(&format!("{key} = \"{v}\"\n"));
                }
                v => {
                    args.push(v.into());
                    toml.push_str(&format!("{key} = {v}\n"));
                }
            }
        }
        let from_flags = Flags::try_parse_from(&args).unwrap().settings;
        let from_file: SchedulerSettings = toml::from_str(&toml).unwrap();
        assert_eq!(from_file, from_flags);
        assert_ne!(from_file, SchedulerSettings::default());
        assert_eq!(from_file.idle, Duration::from_micros(500));
        assert_eq!(from_file.rt_priority, 30);
        assert_eq!(from_file.cpu_wake_latency, WakeLatency::Limit(Duration::from_micros(20)));
        assert_eq!((from_file.arrival_port, from_file.arrival_allow), (vec![8000], vec!["POST ".to_owned()]));
    }

    #[test]
    fn the_file_refuses_what_the_flags_refuse_with_the_same_words() {
        let err = |text: &str| toml::from_str::<SchedulerSettings>(text).unwrap_err().message().to_owned();
        assert_eq!(err("idle = \"50\""), "`50` has no unit: write 50ms (units: ns, us (or µs), ms, s, m, h)");
        assert_eq!(err("idle = 50"), "write a duration as a string with a unit, e.g. \"20ms\"");
        assert_eq!(err("offline_min_share = 1.5"), "`1.5` is not a share in [0, 1) (e.g. 0.2 for 20 %)");
        assert_eq!(
            err("busy_share = 0.6"),
            "`0.6` is not a share in [0, 0.5] (e.g. 0.05 for 5 % of a long online busy period)"
        );
        assert_eq!(err("rt_priority = 120"), "`120` is not a SCHED_FIFO priority in 0..=99 (0: normal scheduling)");
        assert!(err("idel = \"2ms\"").starts_with("unknown field `idel`, expected one of `idle`, `fixed_idle`"));
        assert_eq!(err("arrival_port = [0]"), "`0` is not a TCP port (1-65535)");
        assert_eq!(err("arrival_port = [70000]"), "`70000` is not a TCP port (1-65535)");
        assert_eq!(err("arrival_port = 8000"), "write arrival ports as a list of numbers, e.g. [8000]");
        assert_eq!(
            err("arrival_deny = [\"a\\\\q\"]"),
            "arrival pattern \"a\\\\q\" has a bad escape: use \\r, \\n, \\t, \\\\ or \\xNN"
        );
        assert_eq!(toml::from_str::<SchedulerSettings>("offline_min_share = 0").unwrap(), SchedulerSettings::default());
        assert_eq!(
            Flags::try_parse_from(["gpreempt", "--offline-min-share", "1.5"]).map(|_| ()).unwrap_err().kind(),
            clap::error::ErrorKind::ValueValidation
        );
        for bad in
            [["--arrival-port", "0"], ["--arrival-port", "65536"], ["--arrival-port", "http"], ["--arrival-allow", ""]]
        {
            let e = Flags::try_parse_from(["gpreempt", bad[0], bad[1]]).map(|_| ()).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{bad:?}");
        }
    }
}
