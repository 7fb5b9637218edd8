//! Whether the worker lives, for `/health`: its thread runs and no tick has
//! been running for longer than a bound. Pure: the caller reads the clock.

use std::time::Duration;

/// The worker as liveness sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Liveness {
    /// Running, and between ticks or inside one younger than the bound.
    Live,
    /// The worker thread has stopped (it panicked, or the engine is gone).
    Stopped,
    /// One tick has been running this long, past the bound.
    Stalled(Duration),
}

impl Liveness {
    /// Judges from whether the thread runs, when the tick in progress (if
    /// any) started and the time now, both as offsets from one epoch.
    pub fn judge(
        alive: bool,
        tick_started: Option<Duration>,
        now: Duration,
        bound: Duration,
    ) -> Liveness {
        if !alive {
            return Liveness::Stopped;
        }
        // A worker with no work blocks between ticks, so a tick in progress
        // is exactly a worker that has work.
        match tick_started.map(|t| now.saturating_sub(t)) {
            Some(age) if age > bound => Liveness::Stalled(age),
            _ => Liveness::Live,
        }
    }

    /// True for [`Liveness::Live`].
    pub fn is_live(&self) -> bool {
        matches!(self, Liveness::Live)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_thread_or_a_tick_past_the_bound_is_not_live() {
        let s = Duration::from_secs;
        // (alive, tick started, now, expected)
        let cases = [
            (true, None, s(1000), Liveness::Live),
            (true, Some(s(10)), s(69), Liveness::Live),
            (true, Some(s(10)), s(70), Liveness::Live),
            (true, Some(s(10)), s(71), Liveness::Stalled(s(61))),
            // A stamp from a clock read after `now` is not a stall.
            (true, Some(s(80)), s(70), Liveness::Live),
            (false, None, s(1), Liveness::Stopped),
            (false, Some(s(1)), s(500), Liveness::Stopped),
        ];
        for (alive, started, now, want) in cases {
            let got = Liveness::judge(alive, started, now, s(60));
            assert_eq!(got, want, "{alive} {started:?} {now:?}");
            assert_eq!(got.is_live(), want == Liveness::Live);
        }
    }
}
