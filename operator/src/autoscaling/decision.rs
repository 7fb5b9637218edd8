//! The built-in autoscaler's decision: a pure function of the observed series.
//!
//! Two signals, the larger wins: queue depth (`ceil(waiting / target per
//! replica)`) and KV usage (`ceil(pods * mean usage / target usage)`). A higher
//! recommendation must hold for the whole scale-up window (the window's
//! minimum is taken, so a single burst does not scale); a lower one must hold
//! for the whole scale-down delay (the maximum is taken), and no scale-down
//! happens while requests queue.
//!
//! With `minReplicas: 0` the floor is still one replica while there is work;
//! a model idle for `scaleToZeroAfterSeconds` (see `idle`) goes to zero, and
//! one at zero wakes to one at once when requests wait in ferrox-router
//! (`router::wake::wakes`, the rule the long-poll waker uses too).

use std::cmp::Ordering;
use std::collections::VecDeque;

use super::idle::IdleClock;
use super::observation::Observation;
use crate::crd::AutoscalingSpec;
use crate::router::wake::wakes;

/// Bounds and targets, from `spec.autoscaling`.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Fewest replicas.
    pub min_replicas: i32,
    /// Most replicas.
    pub max_replicas: i32,
    /// Waiting requests one replica should carry.
    pub target_queue_per_replica: f64,
    /// Mean KV usage to hold.
    pub target_kv_usage: f64,
    /// Seconds a higher recommendation must hold.
    pub scale_up_window: i64,
    /// Seconds a lower recommendation must hold.
    pub scale_down_delay: i64,
    /// Seconds idle before scaling to zero (with `min_replicas` 0).
    pub scale_to_zero_after: i64,
}

impl From<&AutoscalingSpec> for Policy {
    fn from(a: &AutoscalingSpec) -> Self {
        Policy {
            min_replicas: a.min_replicas.max(0),
            max_replicas: a.max_replicas.max(a.min_replicas).max(1),
            target_queue_per_replica: a.target_queue_per_replica,
            target_kv_usage: a.target_kv_usage,
            scale_up_window: a.scale_up_stabilization_seconds.max(0),
            scale_down_delay: a.scale_down_delay_seconds.max(0),
            scale_to_zero_after: a.scale_to_zero_after_seconds.max(1),
        }
    }
}

impl Policy {
    /// The policy when nothing could wake a model at zero (no ferrox-router
    /// known): the floor is one replica.
    pub fn without_wake(self) -> Policy {
        Policy {
            min_replicas: self.min_replicas.max(1),
            ..self
        }
    }
}

/// Past recommendations of one ModelDeployment (`now` in Unix seconds).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    samples: VecDeque<(i64, i32)>,
    idle: IdleClock,
}

/// What the autoscaler decided this tick.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Replicas to run (equal to the current count when holding).
    pub desired: i32,
    /// The instantaneous recommendation behind it.
    pub recommendation: i32,
    /// Why, for status and events.
    pub reason: String,
}

impl Decision {
    /// 0 -> 1: `pending` requests wait in ferrox-router.
    pub fn wake(pending: u64) -> Decision {
        Decision {
            desired: 1,
            recommendation: 1,
            reason: format!("wake 0 -> 1: {pending} requests waiting in ferrox-router"),
        }
    }

    /// Whether `spec.replicas` should change.
    pub fn scales(&self, current: i32) -> bool {
        self.desired != current
    }
}

/// The replica count the current observation alone asks for, and which
/// signal won; at least one (zero is the idle rule's call).
pub fn recommend(policy: &Policy, obs: &Observation) -> (i32, &'static str) {
    let queue = ((obs.waiting + obs.pending) / policy.target_queue_per_replica).ceil();
    let kv = (f64::from(obs.pods) * obs.kv_usage / policy.target_kv_usage).ceil();
    let (raw, signal) = if queue >= kv {
        (queue, "queue")
    } else {
        (kv, "kv")
    };
    let clamped = (raw as i64).clamp(
        i64::from(policy.min_replicas.max(1)),
        i64::from(policy.max_replicas.max(1)),
    );
    (clamped as i32, signal)
}

/// Decides the replica count at `now` given `current` replicas; records the sample.
pub fn decide(
    policy: &Policy,
    current: i32,
    obs: &Observation,
    history: &mut History,
    now: i64,
) -> Decision {
    let (rec, signal) = recommend(policy, obs);
    let hold = |reason: String| Decision {
        desired: current,
        recommendation: rec,
        reason,
    };
    if wakes(policy.min_replicas, current, obs.pending as u64) {
        return Decision::wake(obs.pending as u64);
    }
    if current < policy.min_replicas || current > policy.max_replicas {
        let desired = current.clamp(policy.min_replicas, policy.max_replicas);
        return Decision {
            desired,
            recommendation: rec,
            reason: format!(
                "clamped to [{}, {}]",
                policy.min_replicas, policy.max_replicas
            ),
        };
    }
    let idle = history.idle.observe(current, obs, now);
    if current == 0 {
        return hold("scaled to zero: no request waiting in ferrox-router".into());
    }
    if obs.pods == 0 {
        return hold("no ready pod reported metrics".into());
    }
    if policy.min_replicas == 0 && idle >= policy.scale_to_zero_after {
        return Decision {
            desired: 0,
            recommendation: rec,
            reason: format!(
                "scale to zero {current} -> 0: idle {idle} s (nothing running, waiting or finished)"
            ),
        };
    }
    // A queued sample never argues for fewer replicas, so the scale-down delay
    // counts from the moment the queue last emptied.
    let recorded = if obs.waiting > 0.0 {
        rec.max(current)
    } else {
        rec
    };
    history.record(
        now,
        recorded,
        policy.scale_up_window.max(policy.scale_down_delay),
    );
    let signals = format!(
        "queue {:.0} waiting, KV usage {:.2} over {} pods ({signal} signal)",
        obs.waiting, obs.kv_usage, obs.pods
    );
    let target = match rec.cmp(&current) {
        Ordering::Greater => history.settled(now, policy.scale_up_window, Extreme::Min),
        Ordering::Less if obs.waiting > 0.0 => {
            return hold(format!("holding {current}: requests are queued; {signals}"));
        }
        Ordering::Less => history.settled(now, policy.scale_down_delay, Extreme::Max),
        Ordering::Equal => return hold(format!("steady at {current}: {signals}")),
    };
    // The settled target moves only in the direction the recommendation points.
    match target.filter(|t| (*t > current) == (rec > current) && *t != current) {
        Some(t) => Decision {
            desired: t,
            recommendation: rec,
            reason: format!(
                "scale {} {current} -> {t}: {signals}",
                if t > current { "up" } else { "down" }
            ),
        },
        None => hold(format!(
            "holding {current}: {rec} wanted, within the scale-{} window; {signals}",
            if rec > current { "up" } else { "down" }
        )),
    }
}

enum Extreme {
    Min,
    Max,
}

impl History {
    fn record(&mut self, now: i64, rec: i32, keep: i64) {
        self.samples.push_back((now, rec));
        // Keep one sample older than the window so coverage can be told.
        while self.samples.len() > 1 && self.samples[1].0 <= now - keep {
            self.samples.pop_front();
        }
    }

    /// The extreme recommendation over `[now - window, now]`, or `None` when
    /// the history does not yet cover the window.
    fn settled(&self, now: i64, window: i64, extreme: Extreme) -> Option<i32> {
        let first = self.samples.front()?.0;
        if first > now - window {
            return None;
        }
        let recent = self
            .samples
            .iter()
            .filter(|(t, _)| *t >= now - window)
            .map(|(_, r)| *r);
        match extreme {
            Extreme::Min => recent.min(),
            Extreme::Max => recent.max(),
        }
    }

    /// Forgets everything (the policy or the target changed).
    pub fn clear(&mut self) {
        self.samples.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            min_replicas: 1,
            max_replicas: 6,
            target_queue_per_replica: 4.0,
            target_kv_usage: 0.8,
            scale_up_window: 30,
            scale_down_delay: 120,
            scale_to_zero_after: 600,
        }
    }

    fn obs(pods: u32, waiting: f64, kv: f64) -> Observation {
        Observation {
            pods,
            waiting,
            running: if kv > 0.0 { 1.0 } else { 0.0 },
            kv_usage: kv,
            ..Default::default()
        }
    }

    /// Replays `series` (one observation per 10 s tick, pods = current
    /// replicas) and returns the replica count after each tick.
    fn replay(start: i32, series: &[(f64, f64)]) -> Vec<i32> {
        let policy = policy();
        let mut history = History::default();
        let mut current = start;
        series
            .iter()
            .enumerate()
            .map(|(i, (waiting, kv))| {
                let o = obs(current as u32, *waiting, *kv);
                current = decide(&policy, current, &o, &mut history, i as i64 * 10).desired;
                current
            })
            .collect()
    }

    #[test]
    fn recommendation_takes_the_larger_signal() {
        let cases = [
            ((2, 0.0, 0.1), (1, "kv")),
            ((2, 9.0, 0.1), (3, "queue")),
            ((2, 0.0, 0.9), (3, "kv")),
            ((4, 30.0, 0.9), (6, "queue")), // clamped to max
            ((1, 0.0, 0.0), (1, "queue")),  // clamped to min
        ];
        for ((pods, waiting, kv), want) in cases {
            assert_eq!(
                recommend(&policy(), &obs(pods, waiting, kv)),
                want,
                "{pods} {waiting} {kv}"
            );
        }
    }

    #[test]
    fn a_single_burst_does_not_scale() {
        let mut series = vec![(0.0, 0.2); 5];
        series[2] = (40.0, 0.9);
        assert_eq!(replay(1, &series), [1, 1, 1, 1, 1]);
    }

    #[test]
    fn sustained_load_scales_up_after_the_window() {
        // 12 waiting at 1 replica asks for 3; the 30 s window needs 4 ticks.
        let series = vec![(12.0, 0.5); 6];
        assert_eq!(replay(1, &series), [1, 1, 1, 3, 3, 3]);
    }

    #[test]
    fn drain_scales_down_only_after_the_delay_and_an_empty_queue() {
        let mut series = vec![(12.0, 0.5); 4]; // up to 3
        series.extend(vec![(2.0, 0.1); 15]); // queue still non-empty: hold
        series.extend(vec![(0.0, 0.1); 14]); // idle: down after 120 s
        let got = replay(1, &series);
        assert_eq!(got[3], 3);
        assert!(
            got[4..19].iter().all(|&r| r == 3),
            "never down while queued: {got:?}"
        );
        // The idle stretch starts at tick 19; 120 s later (tick 31) it may drop.
        assert!(got[19..31].iter().all(|&r| r == 3), "{got:?}");
        assert_eq!(got[31], 1, "{got:?}");
    }

    #[test]
    fn flapping_load_holds_steady() {
        let series: Vec<_> = (0..30)
            .map(|i| if i % 2 == 0 { (20.0, 0.9) } else { (0.0, 0.1) })
            .collect();
        assert!(replay(2, &series).iter().all(|&r| r == 2));
    }

    #[test]
    fn out_of_bounds_is_clamped_at_once() {
        let mut h = History::default();
        let d = decide(&policy(), 9, &obs(9, 0.0, 0.0), &mut h, 0);
        assert_eq!(d.desired, 6);
        let d = decide(&policy(), 0, &obs(0, 0.0, 0.0), &mut h, 0);
        assert_eq!(d.desired, 1);
        assert!(d.scales(0));
    }

    #[test]
    fn no_metrics_means_no_move() {
        let mut h = History::default();
        let d = decide(&policy(), 3, &Observation::default(), &mut h, 0);
        assert_eq!(d.desired, 3);
        assert!(d.reason.contains("no ready pod"));
    }

    #[test]
    fn zero_windows_act_at_once() {
        let p = Policy {
            scale_up_window: 0,
            scale_down_delay: 0,
            ..policy()
        };
        let mut h = History::default();
        assert_eq!(decide(&p, 1, &obs(1, 12.0, 0.2), &mut h, 0).desired, 3);
        assert_eq!(decide(&p, 3, &obs(3, 0.0, 0.1), &mut h, 10).desired, 1);
    }

    #[test]
    fn from_zero_wakes_at_once_and_idle_returns_to_zero() {
        let p = Policy {
            min_replicas: 0,
            scale_to_zero_after: 60,
            ..policy()
        };
        let mut h = History::default();
        let waiting = Observation {
            pending: 2.0,
            ..Default::default()
        };
        let d = decide(&p, 0, &Observation::default(), &mut h, 0);
        assert_eq!((d.desired, d.scales(0)), (0, false), "{}", d.reason);
        let d = decide(&p, 0, &waiting, &mut h, 10);
        assert_eq!(d.desired, 1, "no window before a wake: {}", d.reason);
        // Up and serving, then quiet: zero after 60 s of quiet, not before.
        let serving = Observation {
            running: 1.0,
            ..obs(1, 0.0, 0.2)
        };
        let quiet = obs(1, 0.0, 0.0);
        let mut ticks = vec![(serving, 20)];
        ticks.extend((3..12).map(|i| (quiet, i * 10)));
        let got: Vec<i32> = ticks
            .iter()
            .map(|(o, t)| decide(&p, 1, o, &mut h, *t).desired)
            .collect();
        assert_eq!(got, [1, 1, 1, 1, 1, 1, 0, 0, 0, 0], "zero 60 s after t=20");
        // The router's waiting requests count as queue while replicas run.
        let queued = Observation {
            pending: 9.0,
            ..obs(1, 3.0, 0.1)
        };
        assert_eq!(recommend(&p, &queued), (3, "queue"));
        // min 0 floors at one replica while there is any work.
        assert_eq!(recommend(&p, &obs(2, 0.0, 0.0)).0, 1);
    }

    #[test]
    fn without_a_router_the_floor_is_one() {
        let p = Policy {
            min_replicas: 0,
            scale_to_zero_after: 1,
            ..policy()
        }
        .without_wake();
        let mut h = History::default();
        assert_eq!(decide(&p, 0, &Observation::default(), &mut h, 0).desired, 1);
        for t in [10, 100, 1000] {
            assert_eq!(decide(&p, 1, &obs(1, 0.0, 0.0), &mut h, t).desired, 1);
        }
    }
}
