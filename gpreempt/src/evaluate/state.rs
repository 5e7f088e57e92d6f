//! The four states an evaluation compares, defined once, and their names in the two documents
//! that record them: `gpreempt evaluate`'s report ([`State::key`]) and the native benchmark's
//! figures (`harness`, BENCHMARKS.json `native`: [`BenchState`]).
//!
//! xtask reads BENCHMARKS.json but does not depend on this library (that would pull aya into every
//! xtask build, docs/architecture.md), so it compiles this one file as its own module
//! (`xtask/src/bench/mod.rs`): the file uses nothing but std and serde.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One condition the online load is measured under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum State {
    /// Online and offline share the GPU, nothing held: what the user has without gpreempt.
    CoLocated,
    /// The offline processes' queues held suspended for the whole state (the harness runs no
    /// offline client): the online service as if alone on the GPU.
    OnlineAlone,
    /// `gpreempt schedule` runs for the state.
    Scheduled,
    /// No load: the offline processes alone.
    OfflineAlone,
}

impl State {
    /// Every state, in the order of an evaluation's first round. Co-located comes first so that
    /// the load command's output is checked (a metric that never matches) before any offline
    /// process is held.
    pub const ALL: [State; 4] = [State::CoLocated, State::OnlineAlone, State::Scheduled, State::OfflineAlone];

    /// The state's name in JSON and on the command line (`gpreempt evaluate`'s report).
    pub fn key(self) -> &'static str {
        match self {
            State::CoLocated => "co_located",
            State::OnlineAlone => "online_alone",
            State::Scheduled => "scheduled",
            State::OfflineAlone => "offline_alone",
        }
    }

    /// As the report's tables name it.
    pub fn label(self) -> &'static str {
        match self {
            State::CoLocated => "co-located",
            State::OnlineAlone => "online alone",
            State::Scheduled => "scheduled",
            State::OfflineAlone => "offline alone",
        }
    }

    /// Whether the online load runs in this state.
    pub fn runs_load(self) -> bool {
        self != State::OfflineAlone
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// A name that is no state's: a [`State::key`] or a [`BenchState`] name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnknownState {
    Key(String),
    BenchName(String),
}

impl fmt::Display for UnknownState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, names): (_, Vec<String>) = match self {
            UnknownState::Key(name) => (name, State::ALL.iter().map(|s| s.key().to_owned()).collect()),
            UnknownState::BenchName(name) => {
                let mut names: Vec<String> = [State::OnlineAlone, State::OfflineAlone, State::CoLocated]
                    .into_iter()
                    .map(|s| BenchState::new(s).to_string())
                    .collect();
                names.push(format!("{}VARIANT", BenchState::SCHEDULE_PREFIX));
                (name, names)
            }
        };
        write!(f, "no state is named {name:?} (the names: {})", names.join(", "))
    }
}

impl std::error::Error for UnknownState {}

impl FromStr for State {
    type Err = UnknownState;

    /// The inverse of [`State::key`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        State::ALL.into_iter().find(|state| state.key() == s).ok_or_else(|| UnknownState::Key(s.to_owned()))
    }
}

impl Serialize for State {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.key())
    }
}

impl<'de> Deserialize<'de> for State {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?.parse().map_err(serde::de::Error::custom)
    }
}

/// A state as the native benchmark measures and names it: the scheduled state once per scheduler
/// variant (`harness/src/variants.rs`). Its name (`Display`, `FromStr`, serde) is the one
/// BENCHMARKS.json stores: `online_alone`, `offline_alone`, `colocated` and `schedule:VARIANT`.
/// Those names were written before [`State::key`] existed; the stored documents keep them, so
/// this name stays apart from the key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BenchState {
    state: State,
    /// The scheduled state's variant; none in the other states.
    variant: Option<String>,
}

impl BenchState {
    /// The variant the scheduled state runs when none is named: `gpreempt schedule`'s defaults.
    pub const DEFAULT_VARIANT: &'static str = "default";
    const COLOCATED: &'static str = "colocated";
    const SCHEDULE_PREFIX: &'static str = "schedule:";

    /// `state`; the scheduled state under [`Self::DEFAULT_VARIANT`].
    pub fn new(state: State) -> Self {
        match state {
            State::Scheduled => Self::scheduled(Self::DEFAULT_VARIANT),
            _ => Self { state, variant: None },
        }
    }

    /// The scheduled state under `variant`.
    pub fn scheduled(variant: &str) -> Self {
        Self { state: State::Scheduled, variant: Some(variant.to_owned()) }
    }

    pub fn state(&self) -> State {
        self.state
    }

    /// The scheduler variant (the scheduled state only).
    pub fn variant(&self) -> Option<&str> {
        self.variant.as_deref()
    }
}

impl fmt::Display for BenchState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.state, &self.variant) {
            (State::CoLocated, _) => f.write_str(Self::COLOCATED),
            (State::Scheduled, v) => write!(f, "{}{}", Self::SCHEDULE_PREFIX, v.as_deref().unwrap_or_default()),
            (state, _) => f.write_str(state.key()),
        }
    }
}

impl FromStr for BenchState {
    type Err = UnknownState;

    /// The inverse of `Display`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == Self::COLOCATED {
            return Ok(Self::new(State::CoLocated));
        }
        if let Some(variant) = s.strip_prefix(Self::SCHEDULE_PREFIX).filter(|v| !v.is_empty()) {
            return Ok(Self::scheduled(variant));
        }
        match s.parse() {
            Ok(state @ (State::OnlineAlone | State::OfflineAlone)) => Ok(Self::new(state)),
            _ => Err(UnknownState::BenchName(s.to_owned())),
        }
    }
}

impl Serialize for BenchState {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for BenchState {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_state_reads_back_from_its_key_and_the_keys_are_the_reports() {
        let keys: Vec<&str> = State::ALL.iter().map(|s| s.key()).collect();
        assert_eq!(keys, ["co_located", "online_alone", "scheduled", "offline_alone"]);
        for state in State::ALL {
            assert_eq!(state.key().parse::<State>(), Ok(state));
            assert_eq!(serde_json::to_string(&state).unwrap(), format!("\"{}\"", state.key()));
            assert_eq!(serde_json::from_str::<State>(&format!("\"{}\"", state.key())).unwrap(), state);
        }
        assert_eq!("colocated".parse::<State>(), Err(UnknownState::Key("colocated".into())));
        assert_eq!(
            "x".parse::<State>().unwrap_err().to_string(),
            r#"no state is named "x" (the names: co_located, online_alone, scheduled, offline_alone)"#
        );
        let labels: Vec<&str> = State::ALL.iter().map(|s| s.label()).collect();
        assert_eq!(labels, ["co-located", "online alone", "scheduled", "offline alone"]);
    }

    #[test]
    fn benchmark_names_are_the_ones_benchmarks_json_stores_and_read_back() {
        let names = [
            (BenchState::new(State::OnlineAlone), "online_alone"),
            (BenchState::new(State::OfflineAlone), "offline_alone"),
            (BenchState::new(State::CoLocated), "colocated"),
            (BenchState::new(State::Scheduled), "schedule:default"),
            (BenchState::scheduled("same-cpu"), "schedule:same-cpu"),
        ];
        for (bench, name) in names {
            assert_eq!(bench.to_string(), name);
            assert_eq!(name.parse::<BenchState>().as_ref(), Ok(&bench));
            assert_eq!(serde_json::to_string(&bench).unwrap(), format!("\"{name}\""));
            assert_eq!(serde_json::from_str::<BenchState>(&format!("\"{name}\"")).unwrap(), bench);
        }
        assert_eq!(BenchState::scheduled("gang").variant(), Some("gang"));
        assert_eq!(BenchState::new(State::CoLocated).variant(), None);
        for wrong in ["co_located", "scheduled", "schedule:", ""] {
            assert_eq!(wrong.parse::<BenchState>(), Err(UnknownState::BenchName(wrong.into())), "{wrong}");
        }
        assert_eq!(
            "x".parse::<BenchState>().unwrap_err().to_string(),
            r#"no state is named "x" (the names: online_alone, offline_alone, colocated, schedule:VARIANT)"#
        );
    }
}
