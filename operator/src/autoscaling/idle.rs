//! How long a model has been idle, for scaling to zero: pure.
//!
//! Idle means no request running, waiting in a server or waiting in the
//! router, and no request finished since the last look (the finished
//! counter catches requests that came and went between two scrapes). A
//! model at zero replicas, or with no pod reporting yet, is never idle: the
//! clock starts when a replica is up and quiet.

use super::observation::Observation;

/// When a model was last seen busy.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IdleClock {
    last_busy: Option<i64>,
    last_finished: Option<f64>,
}

impl IdleClock {
    /// Records the look at `now` (Unix seconds) with `current` replicas;
    /// returns the seconds since the model was last busy.
    pub fn observe(&mut self, current: i32, obs: &Observation, now: i64) -> i64 {
        let finished_moved = self.last_finished.is_some_and(|f| f != obs.finished);
        let busy = current == 0
            || obs.pods == 0
            || obs.running > 0.0
            || obs.waiting > 0.0
            || obs.pending > 0.0
            || finished_moved;
        if obs.pods > 0 {
            self.last_finished = Some(obs.finished);
        }
        let since = match self.last_busy {
            Some(t) if !busy => t,
            _ => now,
        };
        self.last_busy = Some(since);
        now - since
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quiet(finished: f64) -> Observation {
        Observation {
            pods: 1,
            finished,
            ..Default::default()
        }
    }

    #[test]
    fn counts_from_the_last_busy_look() {
        let busy = |f: fn(&mut Observation)| {
            let mut o = quiet(5.0);
            f(&mut o);
            o
        };
        let cases: [(&str, Observation); 5] = [
            ("running", busy(|o| o.running = 1.0)),
            ("waiting", busy(|o| o.waiting = 2.0)),
            ("pending in the router", busy(|o| o.pending = 1.0)),
            ("finished between looks", quiet(6.0)),
            ("no pod reporting", Observation::default()),
        ];
        for (what, obs) in cases {
            let mut clock = IdleClock::default();
            assert_eq!(clock.observe(1, &quiet(5.0), 0), 0, "{what}");
            assert_eq!(clock.observe(1, &quiet(5.0), 30), 30, "{what}");
            assert_eq!(clock.observe(1, &obs, 40), 0, "{what} is busy");
            assert_eq!(
                clock.observe(1, &quiet(obs.finished.max(5.0)), 70),
                30,
                "{what}"
            );
        }
        // At zero replicas the clock does not run.
        let mut clock = IdleClock::default();
        clock.observe(1, &quiet(1.0), 0);
        assert_eq!(clock.observe(0, &Observation::default(), 500), 0);
        assert_eq!(clock.observe(1, &quiet(1.0), 510), 10);
    }
}
