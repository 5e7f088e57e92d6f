//! Whether two selectors can name the same process, decided from their text alone (no host
//! needed, so that `gpreempt agent --check` answers anywhere): the agent refuses a configuration
//! in which one process could be online for one policy and offline for another, or held by two
//! policies' schedulers at once.
//!
//! - Two pids overlap when they are equal.
//! - Two `container:` selectors overlap when they are equal, or when both could be id prefixes
//!   (hexadecimal) and one is a prefix of the other.
//! - Two `pod:` selectors overlap when some namespace matches both namespace globs and some name
//!   matches both name globs (`pod:serving/*` and `pod:serving/vllm-0`, `pod:*/a*` and `pod:*/*b`).
//! - Selectors of different kinds (a pid and a pod) are not compared: which pod a pid is in is
//!   known only on the node, at run time.

use crate::host::select::Selector;

/// Can `a` and `b` name the same process?
pub fn overlaps(a: &Selector, b: &Selector) -> bool {
    match (a, b) {
        (Selector::Pid(x), Selector::Pid(y)) => x == y,
        (Selector::Container(x), Selector::Container(y)) => {
            let hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
            x == y || (hex(x) && hex(y) && (x.starts_with(y.as_str()) || y.starts_with(x.as_str())))
        }
        (Selector::Pod(x), Selector::Pod(y)) => globs_meet(&x.namespace, &y.namespace) && globs_meet(&x.name, &y.name),
        (Selector::PodLabel(x), Selector::PodLabel(y)) => x.can_meet(y),
        _ => false,
    }
}

/// What `a` and `b` both name, for a message: "a process", "a container", "a pod".
pub fn what(a: &Selector) -> &'static str {
    match a {
        Selector::Pid(_) => "process",
        Selector::Container(_) => "container",
        Selector::Pod(_) | Selector::PodLabel(_) => "pod",
    }
}

/// One step of a glob at a position: what the next character may be, and whether the glob stays.
#[derive(Clone, Copy)]
enum Step {
    /// `*`: any character, staying at the star.
    Star,
    /// `?`: any one character.
    Any,
    Char(char),
}

/// Is there a text both globs (`*` any run, `?` any one character, all else literal) match? A
/// walk over pairs of positions in the two globs, a star also standing for nothing.
fn globs_meet(a: &str, b: &str) -> bool {
    let step = |c: char| match c {
        '*' => Step::Star,
        '?' => Step::Any,
        c => Step::Char(c),
    };
    let (a, b): (Vec<Step>, Vec<Step>) = (a.chars().map(step).collect(), b.chars().map(step).collect());
    let mut seen = vec![vec![false; b.len() + 1]; a.len() + 1];
    let mut todo = vec![(0, 0)];
    while let Some((i, j)) = todo.pop() {
        if std::mem::replace(&mut seen[i][j], true) {
            continue;
        }
        if i == a.len() && j == b.len() {
            return true;
        }
        // A star matching nothing.
        if matches!(a.get(i), Some(Step::Star)) {
            todo.push((i + 1, j));
        }
        if matches!(b.get(j), Some(Step::Star)) {
            todo.push((i, j + 1));
        }
        // One character both accept.
        let (Some(&x), Some(&y)) = (a.get(i), b.get(j)) else { continue };
        if let (Step::Char(c), Step::Char(d)) = (x, y)
            && c != d
        {
            continue;
        }
        let next = |s: Step, k: usize| if matches!(s, Step::Star) { k } else { k + 1 };
        todo.push((next(x, i), next(y, j)));
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(s: &str) -> Selector {
        s.parse().unwrap()
    }

    #[test]
    fn globs_meet_when_one_text_matches_both() {
        for (a, b) in [
            ("serving", "serving"),
            ("*", "vllm-0"),
            ("vllm-*", "*-0"),
            ("a*", "*b"),
            ("a?c", "ab*"),
            ("*", "*"),
            ("", "*"),
            ("x*y*z", "*yz"),
        ] {
            assert!(globs_meet(a, b), "{a} / {b}");
            assert!(globs_meet(b, a), "{b} / {a}");
        }
        for (a, b) in
            [("serving", "batch"), ("vllm-*", "train-*"), ("a?", "a"), ("*-0", "*-1"), ("", "?"), ("ab*", "b*")]
        {
            assert!(!globs_meet(a, b), "{a} / {b}");
            assert!(!globs_meet(b, a), "{b} / {a}");
        }
    }

    #[test]
    fn selectors_overlap_within_their_kind_only() {
        assert!(overlaps(&sel("pod:serving/*"), &sel("pod:serving/vllm-0")));
        assert!(overlaps(&sel("pod:*/vllm-0"), &sel("pod:serving/vllm-*")));
        assert!(!overlaps(&sel("pod:serving/*"), &sel("pod:batch/*")));
        assert!(overlaps(&sel("4242"), &sel("4242")));
        assert!(!overlaps(&sel("4242"), &sel("4243")));
        assert!(overlaps(&sel("container:trainer"), &sel("container:trainer")));
        assert!(!overlaps(&sel("container:trainer"), &sel("container:trainer-2")));
        assert!(overlaps(&sel("container:3f2a"), &sel("container:3f2a9c01")));
        assert!(!overlaps(&sel("container:4242"), &sel("4242")));
        assert!(!overlaps(&sel("container:serving"), &sel("pod:serving/*")));
        assert!(!overlaps(&sel("pod-label:gpreempt.io/role=online"), &sel("pod-label:gpreempt.io/role=offline")));
        assert!(overlaps(&sel("pod-label:gpreempt.io/role=online"), &sel("pod-label:app=llm")));
        assert!(!overlaps(&sel("pod-label:app=llm,role!=batch"), &sel("pod-label:role=batch")));
        assert!(!overlaps(&sel("pod-label:app=llm"), &sel("pod:serving/*")), "a name and labels are not compared");
    }
}
