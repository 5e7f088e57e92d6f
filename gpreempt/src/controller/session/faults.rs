//! Faults the VM tests inject into a session, read from `GPREEMPT_TEST_FAULT` (comma separated):
//! `after-suspend` fails the step that follows a successful SUSPEND_QUEUES (as a failed
//! re-snapshot would); `resume=N` fails the next N RESUME_QUEUES with EIO before the ioctl.
//! (`reaction-panic`, read by the scheduler's reaction thread, panics it after its first suspend.)
//!
//! Compiled in only with the `fault-injection` cargo feature, which `cargo xtask test` enables
//! for the binaries it runs in the VM; without it [`Faults`] is empty and the variable is ignored.

#[cfg(feature = "fault-injection")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Faults {
    after_suspend: bool,
    resume_failures: u32,
}

#[cfg(feature = "fault-injection")]
impl Faults {
    const VAR: &'static str = "GPREEMPT_TEST_FAULT";

    fn parse(spec: &str) -> Self {
        let mut f = Self::default();
        for item in spec.split(',').map(str::trim) {
            match item.split_once('=') {
                None if item == "after-suspend" => f.after_suspend = true,
                Some(("resume", n)) => f.resume_failures = n.parse().unwrap_or(0),
                _ => {}
            }
        }
        f
    }

    pub(super) fn from_env() -> Self {
        std::env::var(Self::VAR).map(|s| Self::parse(&s)).unwrap_or_default()
    }

    pub(super) fn after_suspend(&self) -> bool {
        self.after_suspend
    }

    /// Whether this RESUME fails (one of the `resume=N` still to come).
    pub(super) fn take_resume_failure(&mut self) -> bool {
        let fail = self.resume_failures > 0;
        self.resume_failures = self.resume_failures.saturating_sub(1);
        fail
    }

    /// No more injected RESUME failures: detach must resume.
    pub(super) fn clear(&mut self) {
        self.resume_failures = 0;
    }
}

#[cfg(not(feature = "fault-injection"))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Faults;

#[cfg(not(feature = "fault-injection"))]
impl Faults {
    pub(super) fn from_env() -> Self {
        Self
    }

    #[inline(always)]
    pub(super) fn after_suspend(&self) -> bool {
        false
    }

    #[inline(always)]
    pub(super) fn take_resume_failure(&mut self) -> bool {
        false
    }

    pub(super) fn clear(&mut self) {}
}

#[cfg(all(test, feature = "fault-injection"))]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_from_the_test_variable() {
        assert_eq!(Faults::parse("after-suspend"), Faults { after_suspend: true, resume_failures: 0 });
        assert_eq!(Faults::parse("resume=3, after-suspend"), Faults { after_suspend: true, resume_failures: 3 });
        assert_eq!(Faults::parse(""), Faults::default());
        let mut f = Faults::parse("resume=1");
        assert_eq!((f.take_resume_failure(), f.take_resume_failure()), (true, false));
    }
}
