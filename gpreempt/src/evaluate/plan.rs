//! The order an evaluation runs its states in ([`super::state`]): each round runs the four
//! states once, the order rotated by one between rounds so that no state always follows the same
//! one (a training job's warm-up, a load generator's cache, a GPU's clocks settle over time, and
//! a fixed order would charge that drift to one state).

use serde::Serialize;

use super::state::State;

/// One state of one round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Step {
    /// From 1.
    pub round: u32,
    pub state: State,
}

/// Every step of `rounds` rounds: round r (from 1) runs [`State::ALL`] rotated left by
/// r − 1, so each state takes each position once every four rounds.
pub fn plan(rounds: u32) -> Vec<Step> {
    let n = State::ALL.len();
    (1..=rounds)
        .flat_map(|round| {
            let shift = (round as usize - 1) % n;
            (0..n).map(move |i| Step { round, state: State::ALL[(i + shift) % n] })
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
