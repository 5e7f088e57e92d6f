//! The states an evaluation compares and the order it runs them in: each round runs the four
//! states once, the order rotated by one between rounds so that no state always follows the same
//! one (a training job's warm-up, a load generator's cache, a GPU's clocks settle over time, and
//! a fixed order would charge that drift to one state).

use serde::Serialize;

/// One condition the load command is measured under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Online and offline share the GPU, nothing held: what the user has without gpreempt.
    CoLocated,
    /// The offline processes' queues held suspended for the whole state: the online service as
    /// if alone on the GPU (their CPU threads still run).
    OnlineAlone,
    /// `gpreempt schedule` runs for the state.
    Scheduled,
    /// No load: the offline processes alone, for as long as the longest load run so far.
    OfflineAlone,
}

impl State {
    /// The order of the first round. Co-located comes first so that the load command's output
    /// is checked (a metric that never matches) before any offline process is held.
    pub const FIRST_ROUND: [State; 4] = [State::CoLocated, State::OnlineAlone, State::Scheduled, State::OfflineAlone];

    /// As the report's tables name it.
    pub fn label(self) -> &'static str {
        match self {
            State::CoLocated => "co-located",
            State::OnlineAlone => "online alone",
            State::Scheduled => "scheduled",
            State::OfflineAlone => "offline alone",
        }
    }

    /// Whether the load command runs in this state.
    pub fn runs_load(self) -> bool {
        self != State::OfflineAlone
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// One state of one round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Step {
    /// From 1.
    pub round: u32,
    pub state: State,
}

/// Every step of `rounds` rounds: round r (from 1) runs [`State::FIRST_ROUND`] rotated left by
/// r − 1, so each state takes each position once every four rounds.
pub fn plan(rounds: u32) -> Vec<Step> {
    let n = State::FIRST_ROUND.len();
    (1..=rounds)
        .flat_map(|round| {
            let shift = (round as usize - 1) % n;
            (0..n).map(move |i| Step { round, state: State::FIRST_ROUND[(i + shift) % n] })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use State::*;

    #[test]
    fn the_first_state_is_co_located_and_each_round_rotates_the_order_by_one() {
        let states: Vec<(u32, State)> = plan(5).into_iter().map(|s| (s.round, s.state)).collect();
        assert_eq!(
            states,
            [
                (1, CoLocated),
                (1, OnlineAlone),
                (1, Scheduled),
                (1, OfflineAlone),
                (2, OnlineAlone),
                (2, Scheduled),
                (2, OfflineAlone),
                (2, CoLocated),
                (3, Scheduled),
                (3, OfflineAlone),
                (3, CoLocated),
                (3, OnlineAlone),
                (4, OfflineAlone),
                (4, CoLocated),
                (4, OnlineAlone),
                (4, Scheduled),
                (5, CoLocated),
                (5, OnlineAlone),
                (5, Scheduled),
                (5, OfflineAlone),
            ]
        );
        assert!(plan(0).is_empty());
        assert_eq!(
            serde_json::to_string(&Step { round: 2, state: OnlineAlone }).unwrap(),
            r#"{"round":2,"state":"online_alone"}"#
        );
    }
}
