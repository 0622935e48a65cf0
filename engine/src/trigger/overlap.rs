//! What a cron firing does while the run its trigger started last is still going.

use crate::spec::Overlap;

/// What a firing does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Start its run now.
    Start,
    /// Start no run; the firing is recorded as skipped.
    Skip,
    /// Start its run once the runs before it have ended.
    Queue,
    /// Cancel the runs still going, then start its run.
    CancelPrevious,
}

/// The decision for a firing under `policy`, given whether the trigger's previous run is still active.
pub fn decide(policy: Overlap, previous_active: bool) -> Decision {
    match (previous_active, policy) {
        (false, _) => Decision::Start,
        (true, Overlap::Skip) => Decision::Skip,
        (true, Overlap::Queue) => Decision::Queue,
        (true, Overlap::CancelPrevious) => Decision::CancelPrevious,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_firing_starts_unless_the_previous_run_is_active_and_then_follows_the_policy() {
        for policy in [Overlap::Skip, Overlap::Queue, Overlap::CancelPrevious] {
            assert_eq!(decide(policy, false), Decision::Start, "{policy:?}");
        }
        assert_eq!(decide(Overlap::Skip, true), Decision::Skip);
        assert_eq!(decide(Overlap::Queue, true), Decision::Queue);
        assert_eq!(
            decide(Overlap::CancelPrevious, true),
            Decision::CancelPrevious
        );
    }
}
