//! How quickly an idle CPU must wake for the reaction thread (`--cpu-wake-latency`): a CPU
//! latency PM QoS request held on `/dev/cpu_dma_latency` while the scheduler runs.
//!
//! Why: the reaction thread sleeps in poll(2) until a probe's ring buffer wakes it, and the CPU it
//! wakes on is usually idle. Waking an idle CPU costs what its idle state costs to leave: on bare
//! metal the deep C-states take tens to hundreds of microseconds (each state's exit latency is in
//! `/sys/devices/system/cpu/cpu*/cpuidle/state*/latency`); in a KVM guest a halted vCPU is a VM
//! exit the host wakes at its own pace. Measured on this project's Firecracker host
//! (`harness wake-floor`, a SCHED_FIFO thread in poll(2) woken across CPUs by an eventfd write):
//! p50 32.8 / p99 72.3 µs with the idle states as they were, 5.3 / 22.1 µs while a request of 0
//! was held. That wake is most of arrival → SUSPEND (BENCHMARKS §9.5).
//!
//! The request is the kernel's own interface for this (Documentation/power/pm_qos_interface.rst,
//! "From user space"): open the device, write the limit in microseconds as a binary s32, and the
//! limit holds while the file stays open. The kernel drops it when the file is closed, which
//! includes every way the process can end (kill -9 too), so nothing is left behind on any exit
//! path. The cpuidle governors then choose no state whose exit latency is above the limit; with a
//! limit of 0 an idle CPU polls (the haltpoll governor, drivers/cpuidle/governors/haltpoll.c,
//! returns its polling state 0 when the latency request is 0).
//!
//! `auto`: 0 in a KVM guest with the haltpoll cpuidle driver (its halt state claims 1 µs of exit
//! latency, but the real cost is the host's wake-up, which only polling avoids), and
//! [`AUTO_LIMIT_US`] otherwise, which keeps the halt state (C1, about 1 µs) and excludes the deep
//! ones. The cost is power: idle CPUs stay in shallow states (or poll) while gpreempt schedules.
//! `off` leaves the idle states alone.

use std::{
    fmt,
    fs::File,
    io::Write,
    path::{Path, PathBuf},
    str::FromStr,
    time::Duration,
};

use serde::{Serialize, Serializer};

/// The device of the CPU latency PM QoS request.
pub const DEVICE: &str = "/dev/cpu_dma_latency";

/// `auto`'s limit outside a haltpoll guest: above C1's exit latency (1 µs in the ACPI and
/// intel_idle tables), below the deep states' (C6 and package states: tens to hundreds of µs),
/// and a tenth of the 100 µs arrival → SUSPEND goal.
pub const AUTO_LIMIT_US: u32 = 10;

/// `--cpu-wake-latency`: the exit latency the idle CPUs may have while the scheduler runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WakeLatency {
    /// 0 in a haltpoll guest, [`AUTO_LIMIT_US`] otherwise (the scheduler's default).
    Auto,
    /// No request: the idle states as the host has them.
    Off,
    /// At most this long (rounded down to whole microseconds).
    Limit(Duration),
}

/// A `--cpu-wake-latency` value that is none of `auto`, `off` or a duration.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a wake latency: give `auto`, `off`, or a duration such as 10us ({why})")]
pub struct WakeLatencyError {
    text: String,
    why: String,
}

impl FromStr for WakeLatency {
    type Err = WakeLatencyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "auto" => Ok(Self::Auto),
            "off" => Ok(Self::Off),
            t => crate::duration::parse(t, "us")
                .map(Self::Limit)
                .map_err(|why| WakeLatencyError { text: s.to_owned(), why }),
        }
    }
}

impl fmt::Display for WakeLatency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Off => f.write_str("off"),
            Self::Limit(d) => write!(f, "{}us", d.as_micros()),
        }
    }
}

impl Serialize for WakeLatency {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for WakeLatency {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// One cpuidle state of a CPU, as sysfs names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdleState {
    pub name: String,
    /// Exit latency, µs (`latency`).
    pub latency_us: u32,
}

/// The host's cpuidle facts that decide the limit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdleStates {
    /// `cpuidle/current_driver` (`haltpoll`, `intel_idle`, `acpi_idle`); None without cpuidle.
    pub driver: Option<String>,
    /// CPU 0's states, shallowest first.
    pub states: Vec<IdleState>,
}

impl IdleStates {
    /// Read from `sys_cpu` (`/sys/devices/system/cpu`). Missing files are no states: a host
    /// without cpuidle has nothing to limit.
    pub fn read(sys_cpu: &Path) -> Self {
        let text = |p: PathBuf| std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned());
        let driver = text(sys_cpu.join("cpuidle/current_driver")).filter(|d| !d.is_empty() && d != "none");
        let mut states = Vec::new();
        for i in 0.. {
            let dir = sys_cpu.join(format!("cpu0/cpuidle/state{i}"));
            let (Some(name), Some(latency)) = (text(dir.join("name")), text(dir.join("latency"))) else { break };
            // A latency sysfs could not give as a number is no state to reason about.
            let Ok(latency_us) = latency.parse() else { break };
            states.push(IdleState { name, latency_us });
        }
        Self { driver, states }
    }

    /// The limit `setting` asks for on this host (None: no request).
    pub fn limit_us(&self, setting: WakeLatency) -> Option<u32> {
        match setting {
            WakeLatency::Off => None,
            WakeLatency::Limit(d) => Some(u32::try_from(d.as_micros()).unwrap_or(u32::MAX).min(i32::MAX as u32)),
            WakeLatency::Auto if self.driver.as_deref() == Some("haltpoll") => Some(0),
            WakeLatency::Auto => Some(AUTO_LIMIT_US),
        }
    }

    /// The states a limit of `limit_us` keeps out (`C6 (133 µs)`), for the report.
    pub fn excluded(&self, limit_us: u32) -> Vec<String> {
        self.states
            .iter()
            .filter(|s| s.latency_us > limit_us)
            .map(|s| format!("{} ({} µs)", s.name, s.latency_us))
            .collect()
    }
}

/// The request, in force while this lives.
#[derive(Debug)]
pub struct Request {
    // Held, never read: the kernel keeps the limit while the file is open.
    _file: File,
    pub limit_us: u32,
}

/// What holding a setting on this host came to.
#[derive(Debug)]
pub struct Held {
    /// The cpuidle driver (`haltpoll` in a KVM guest).
    pub driver: Option<String>,
    /// The limit asked for, µs (None: `off`).
    pub limit_us: Option<u32>,
    /// The idle states it keeps out, when held.
    pub excluded: Vec<String>,
    /// The request, in force while this lives; None when `off` or refused.
    pub request: Option<Request>,
    /// Why the device refused it.
    pub refused: Option<std::io::Error>,
}

/// Hold `setting` on this host (the idle states of `/sys/devices/system/cpu`, the request on
/// [`DEVICE`]).
pub fn hold(setting: WakeLatency) -> Held {
    let idle = IdleStates::read(Path::new("/sys/devices/system/cpu"));
    let limit_us = idle.limit_us(setting);
    let mut held = Held { driver: idle.driver.clone(), limit_us, excluded: Vec::new(), request: None, refused: None };
    if let Some(limit) = limit_us {
        match request(Path::new(DEVICE), limit) {
            Ok(r) => {
                held.excluded = idle.excluded(limit);
                held.request = Some(r);
            }
            Err(e) => held.refused = Some(e),
        }
    }
    held
}

/// Ask the kernel, through `device`, for idle CPUs that wake within `limit_us`.
pub fn request(device: &Path, limit_us: u32) -> std::io::Result<Request> {
    let mut file = std::fs::OpenOptions::new().write(true).open(device)?;
    // The value is a binary s32 (a 4-byte write; anything else is parsed as hex text).
    let value = i32::try_from(limit_us).unwrap_or(i32::MAX);
    file.write_all(&value.to_ne_bytes())?;
    Ok(Request { _file: file, limit_us })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_reads_auto_off_and_durations_and_names_its_error() {
        assert_eq!("auto".parse(), Ok(WakeLatency::Auto));
        assert_eq!(" off ".parse(), Ok(WakeLatency::Off));
        assert_eq!("10us".parse(), Ok(WakeLatency::Limit(Duration::from_micros(10))));
        assert_eq!("0us".parse(), Ok(WakeLatency::Limit(Duration::ZERO)));
        let e = "10".parse::<WakeLatency>().unwrap_err().to_string();
        assert_eq!(
            e,
            "`10` is not a wake latency: give `auto`, `off`, or a duration such as 10us (`10` has no unit: write \
             10us (units: ns, us (or µs), ms, s, m, h))"
        );
        assert_eq!(WakeLatency::Limit(Duration::from_micros(20)).to_string(), "20us");
    }

    fn host(driver: &str, states: &[(&str, u32)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("cpuidle")).expect("mkdir");
        std::fs::write(dir.path().join("cpuidle/current_driver"), format!("{driver}\n")).expect("write");
        for (i, (name, latency)) in states.iter().enumerate() {
            let s = dir.path().join(format!("cpu0/cpuidle/state{i}"));
            std::fs::create_dir_all(&s).expect("mkdir");
            std::fs::write(s.join("name"), format!("{name}\n")).expect("write");
            std::fs::write(s.join("latency"), format!("{latency}\n")).expect("write");
        }
        dir
    }

    #[test]
    fn auto_polls_in_a_haltpoll_guest_and_keeps_c1_on_bare_metal() {
        let guest = IdleStates::read(host("haltpoll", &[("POLL", 0), ("haltpoll idle", 1)]).path());
        assert_eq!(guest.driver.as_deref(), Some("haltpoll"));
        assert_eq!(guest.limit_us(WakeLatency::Auto), Some(0));
        assert_eq!(guest.excluded(0), vec!["haltpoll idle (1 µs)".to_owned()]);

        let metal = IdleStates::read(host("acpi_idle", &[("POLL", 0), ("C1", 1), ("C2", 18), ("C3", 350)]).path());
        assert_eq!(metal.limit_us(WakeLatency::Auto), Some(AUTO_LIMIT_US));
        assert_eq!(metal.excluded(AUTO_LIMIT_US), vec!["C2 (18 µs)".to_owned(), "C3 (350 µs)".to_owned()]);
        assert_eq!(metal.limit_us(WakeLatency::Off), None);
        assert_eq!(metal.limit_us(WakeLatency::Limit(Duration::from_micros(25))), Some(25));
    }

    #[test]
    fn a_host_without_cpuidle_has_no_states_and_auto_still_asks() {
        let none = IdleStates::read(Path::new("/nonexistent/sys/devices/system/cpu"));
        assert_eq!(none, IdleStates::default());
        assert_eq!(none.limit_us(WakeLatency::Auto), Some(AUTO_LIMIT_US));
        assert!(none.excluded(0).is_empty());
    }

    #[test]
    fn the_request_writes_a_binary_s32() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dev = dir.path().join("cpu_dma_latency");
        std::fs::write(&dev, b"").expect("create");
        let r = request(&dev, 10).expect("request");
        assert_eq!(r.limit_us, 10);
        assert_eq!(std::fs::read(&dev).expect("read"), 10i32.to_ne_bytes());
        let e = request(&dir.path().join("absent"), 0).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    }
}
