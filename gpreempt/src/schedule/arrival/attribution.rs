//! Which request a submission is the first GPU work of. Pure: timestamps in ns of
//! CLOCK_MONOTONIC, no I/O.
//!
//! The reaction thread sees an online process's submissions only as its write indices moving
//! (or a doorbell store), with nothing that names the request. Taking every movement as the
//! oldest pending request's first work, as the first version did, goes wrong in two ways the
//! native harness showed (`harness run --cpu-phase vllm-mi300x`, a hold's "first work" 0.9 ms
//! before its own CPU phase could have ended):
//! - **a request already on the GPU submits again** (a dispatch published after the look that
//!   saw its first one; every decode step of an LLM server): the movement ended the next
//!   request's hold, whose own first kernel then came after an idle resume and waited for the
//!   SUSPENDs again;
//! - **a short request overtakes a long one** (its CPU phase is shorter: tokenization grows with
//!   the prompt): its work ended the long one's hold, and each learnt the other's lead.
//!
//! So a movement is matched against the holds' predictions (the lead model's bracket,
//! [`super::lead`]): it is the first work of the pending request whose predicted first work is
//! nearest to it; and while the process's earlier work is still in flight (its indices showed
//! work at the look before this movement), a movement before a hold's `own_from` is taken as that
//! earlier work's continuation and ends no hold. `own_from` lies one bracket width below the
//! bracket's early edge, so a request whose own lead falls inside its bracket, or a little below,
//! is never mistaken for a continuation. From an idle process every movement is some request's
//! first work (a lead that got shorter is still learnt: the bracket follows it,
//! `lead::tests::the_bracket_follows_each_sample_as_the_window_slides`). Cold holds (no bracket
//! yet) keep the first version's rule: the oldest takes the movement.

/// A pending hold as the attribution sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// What its plan predicts (None: cold, nothing learnt yet).
    pub prediction: Option<Prediction>,
    /// The process's submissions moved since this hold's baseline (or a doorbell store came at or
    /// after its arrival): the movement may be its request's.
    pub moved: bool,
}

/// Where a warm plan expects a request's first work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prediction {
    /// The middle of the lead's bracket, absolute.
    pub expected_ns: u64,
    /// The earliest instant a movement made while earlier work is in flight is taken as this
    /// request's own first work, absolute.
    pub own_from_ns: u64,
}

impl Prediction {
    /// The prediction of a request that arrived at `arrival_ns` with the lead's bracket
    /// `(early, late)` (ns after the arrival).
    pub fn of(arrival_ns: u64, (early, late): (u64, u64)) -> Self {
        let width = late.saturating_sub(early);
        Self { expected_ns: arrival_ns + early + width / 2, own_from_ns: arrival_ns + early.saturating_sub(width) }
    }
}

/// What a movement seen at `work_ns` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attribution {
    /// The first work of the hold at this index.
    First(usize),
    /// The earlier work's continuation: no hold ends (the holds it was too early for are not
    /// learnt from: their own first work may have been it).
    Continuation,
    /// No hold saw a movement.
    Nothing,
}

/// Which of `holds` (oldest first) the movement seen at `work_ns` is the first work of;
/// `in_flight`: the process's indices showed work at the look before this one.
pub fn attribute(holds: &[Candidate], work_ns: u64, in_flight: bool) -> Attribution {
    let moved = || holds.iter().enumerate().filter(|(_, h)| h.moved);
    if moved().next().is_none() {
        return Attribution::Nothing;
    }
    let accepting = moved().filter(|(_, h)| !in_flight || h.prediction.is_none_or(|p| work_ns >= p.own_from_ns));
    // Cold holds first, oldest first; then the nearest prediction, the oldest on a tie
    // (min_by_key keeps the first of equal keys).
    let key = |h: &Candidate| (h.prediction.is_some(), h.prediction.map_or(0, |p| p.expected_ns.abs_diff(work_ns)));
    match accepting.min_by_key(|(_, h)| key(h)) {
        Some((i, _)) => Attribution::First(i),
        None => Attribution::Continuation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const US: u64 = 1_000;

    fn warm(arrival_ns: u64, bracket: (u64, u64)) -> Candidate {
        Candidate { prediction: Some(Prediction::of(arrival_ns, bracket)), moved: true }
    }

    #[test]
    fn the_prediction_is_the_brackets_middle_and_own_work_starts_one_width_below_it() {
        assert_eq!(
            Prediction::of(10 * MS, (4 * MS, 5 * MS)),
            Prediction { expected_ns: 14 * MS + MS / 2, own_from_ns: 13 * MS }
        );
        // A bracket wider than its early edge: own work from the arrival on.
        assert_eq!(Prediction::of(10 * MS, (MS, 4 * MS)).own_from_ns, 10 * MS);
    }

    #[test]
    fn from_idle_every_movement_is_a_first_work_even_far_before_its_bracket() {
        // One hold, bracket 4.0-4.1 ms; its work 1 ms after the arrival (the lead got shorter).
        let holds = [warm(0, (4 * MS, 4 * MS + 100 * US))];
        assert_eq!(attribute(&holds, MS, false), Attribution::First(0));
    }

    #[test]
    fn while_earlier_work_is_in_flight_a_movement_before_own_from_is_its_continuation() {
        // The native trace's case: a request arrived while another's dispatches ran; its bracket
        // 4.60-4.66 ms; a movement 3.76 ms after its arrival, the other's second publish.
        let holds = [warm(0, (4_604 * US, 4_660 * US))];
        assert_eq!(attribute(&holds, 3_758 * US, true), Attribution::Continuation);
        // Its own first work inside (or a width below) the bracket ends it.
        assert_eq!(attribute(&holds, 4_610 * US, true), Attribution::First(0));
        assert_eq!(attribute(&holds, 4_550 * US, true), Attribution::First(0));
        assert_eq!(attribute(&holds, 4_540 * US, true), Attribution::Continuation);
    }

    #[test]
    fn a_short_request_that_overtakes_a_long_one_ends_its_own_hold() {
        // A 40 KB prompt (lead ≈ 15.8 ms) at 0; a 400-byte one (lead ≈ 3.3 ms) at 1 ms: the short
        // one's work at 4.3 ms is its own, the long one's at 15.8 ms too.
        let long = warm(0, (15_700 * US, 15_900 * US));
        let short = warm(MS, (3_250 * US, 3_350 * US));
        assert_eq!(attribute(&[long, short], 4_300 * US, false), Attribution::First(1));
        assert_eq!(attribute(&[long], 15_800 * US, true), Attribution::First(0));
    }

    #[test]
    fn cold_holds_are_taken_oldest_first_and_holds_that_saw_no_movement_are_not_candidates() {
        let cold = Candidate { prediction: None, moved: true };
        assert_eq!(attribute(&[cold, cold], 5 * MS, true), Attribution::First(0));
        // Cold before warm, whatever the distances.
        assert_eq!(attribute(&[warm(0, (5 * MS, 5 * MS)), cold], 5 * MS, false), Attribution::First(1));
        // The older hold's baseline was read after the movement (opened at this step): not it.
        let fresh = Candidate { moved: false, ..cold };
        assert_eq!(attribute(&[fresh, cold], 5 * MS, false), Attribution::First(1));
        assert_eq!(attribute(&[fresh], 5 * MS, false), Attribution::Nothing);
        assert_eq!(attribute(&[], 5 * MS, false), Attribution::Nothing);
    }

    #[test]
    fn equal_distances_go_to_the_oldest() {
        let holds = [warm(0, (2 * MS, 2 * MS)), warm(2 * MS, (0, 0))];
        assert_eq!(attribute(&holds, 2 * MS, false), Attribution::First(0));
    }
}
