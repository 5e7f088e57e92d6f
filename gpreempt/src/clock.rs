//! The clocks gpreempt reads: CLOCK_BOOTTIME (what eBPF's `bpf_ktime_get_boot_ns` and KFD's SMI
//! events stamp), CLOCK_MONOTONIC (what `Instant` uses, as a number other processes can compare),
//! and the conversion of CLOCK_BOOTTIME to wall-clock time, once, at output.

use nix::time::{ClockId, clock_gettime};

/// Offset between CLOCK_REALTIME and CLOCK_BOOTTIME, taken once at start.
#[derive(Clone, Copy, Debug)]
pub struct WallClock {
    realtime_minus_boottime_ns: i128,
}

/// Nanoseconds on `clock` (0 if the clock cannot be read, which Linux never refuses for these).
fn now_ns(clock: ClockId) -> i128 {
    clock_gettime(clock).map_or(0, |t| i128::from(t.tv_sec()) * 1_000_000_000 + i128::from(t.tv_nsec()))
}

/// CLOCK_BOOTTIME now, ns: the time base of every [`crate::event::Event`].
pub fn boottime_ns() -> u64 {
    now_ns(ClockId::CLOCK_BOOTTIME) as u64
}

/// CLOCK_MONOTONIC now, ns. Read twice per ioctl on the controller's per-cycle path, so it is
/// the bare vDSO call, inlined: under software emulation every extra call level and 128-bit
/// conversion is a measurable part of a cycle.
#[inline(always)]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out pointer; CLOCK_MONOTONIC always exists (0 is returned if it did not).
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

/// CPU time of the calling thread (user + system), ns: a system call, for what is rare (a
/// transition, the end of a run), never for a loop's every step.
pub fn thread_cpu_ns() -> u64 {
    now_ns(ClockId::CLOCK_THREAD_CPUTIME_ID) as u64
}

impl WallClock {
    pub fn now() -> Self {
        Self::from_offset(now_ns(ClockId::CLOCK_REALTIME) - now_ns(ClockId::CLOCK_BOOTTIME))
    }

    pub fn from_offset(realtime_minus_boottime_ns: i128) -> Self {
        Self { realtime_minus_boottime_ns }
    }

    /// Unix time in ns of a CLOCK_BOOTTIME timestamp.
    pub fn unix_ns(&self, boottime_ns: u64) -> i128 {
        i128::from(boottime_ns) + self.realtime_minus_boottime_ns
    }

    /// `2026-11-21T10:07:01.123456Z`
    pub fn rfc3339(&self, boottime_ns: u64) -> String {
        let (days, secs_of_day, micros) = split(self.unix_ns(boottime_ns));
        let (y, m, d) = civil_from_days(days);
        format!("{y:04}-{m:02}-{d:02}T{}.{micros:06}Z", hms(secs_of_day))
    }

    /// `10:07:01.123456` (UTC), for console lines.
    pub fn time_of_day(&self, boottime_ns: u64) -> String {
        let (_, secs_of_day, micros) = split(self.unix_ns(boottime_ns));
        format!("{}.{micros:06}", hms(secs_of_day))
    }
}

fn split(unix_ns: i128) -> (i64, i64, i64) {
    let secs = unix_ns.div_euclid(1_000_000_000) as i64;
    let micros = (unix_ns.rem_euclid(1_000_000_000) / 1_000) as i64;
    (secs.div_euclid(86_400), secs.rem_euclid(86_400), micros)
}

fn hms(secs_of_day: i64) -> String {
    format!("{:02}:{:02}:{:02}", secs_of_day / 3600, secs_of_day / 60 % 60, secs_of_day % 60)
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boottime_converts_to_utc_wall_time() {
        // 2026-11-21T10:07:01.123456Z is 1795255621.123456 s after the epoch.
        let clock = WallClock::from_offset(1_795_255_621_000_000_000 - 5_000_000_000);
        assert_eq!(clock.rfc3339(5_123_456_789), "2026-11-21T10:07:01.123456Z");
        assert_eq!(clock.time_of_day(5_123_456_789), "10:07:01.123456");
        assert_eq!(WallClock::from_offset(0).rfc3339(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
