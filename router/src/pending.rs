//! The waiting line of scale-from-zero: requests for a model with no ready
//! endpoint wait here, per model, bounded, each until its own deadline, and
//! leave in arrival order when an endpoint is ready. Pure: deadlines and
//! `now` are parameters (any ordered clock).

use std::collections::{BTreeMap, VecDeque};

use crate::error::RouterError;

/// One waiting request.
#[derive(Debug)]
struct Waiter<T, D> {
    id: u64,
    deadline: D,
    item: T,
}

/// Per-model FIFO lines of at most `max_per_model` waiters each.
#[derive(Debug)]
pub struct Pending<T, D> {
    lines: BTreeMap<String, VecDeque<Waiter<T, D>>>,
    max_per_model: usize,
    next_id: u64,
}

impl<T, D: Ord + Copy> Pending<T, D> {
    /// Empty lines of at most `max_per_model` each.
    pub fn new(max_per_model: usize) -> Self {
        Pending {
            lines: BTreeMap::new(),
            max_per_model,
            next_id: 0,
        }
    }

    /// Queues `item` for `model` until `deadline`; its id, or `QueueFull`.
    pub fn push(&mut self, model: &str, item: T, deadline: D) -> Result<u64, RouterError> {
        let line = self.lines.entry(model.to_string()).or_default();
        if line.len() >= self.max_per_model {
            return Err(RouterError::QueueFull {
                model: model.to_string(),
                limit: self.max_per_model,
            });
        }
        let id = self.next_id;
        self.next_id += 1;
        line.push_back(Waiter { id, deadline, item });
        Ok(id)
    }

    /// Takes every waiter of `model` whose deadline has not passed at
    /// `now`, first come first, for an endpoint that became ready; the
    /// expired ones stay for [`Pending::expire`].
    pub fn release(&mut self, model: &str, now: D) -> Vec<T> {
        let Some(line) = self.lines.get_mut(model) else {
            return Vec::new();
        };
        let (live, expired): (VecDeque<_>, VecDeque<_>) =
            line.drain(..).partition(|w| w.deadline > now);
        *line = expired;
        if line.is_empty() {
            self.lines.remove(model);
        }
        live.into_iter().map(|w| w.item).collect()
    }

    /// Takes every waiter whose deadline is at or before `now`, in arrival
    /// order within each model: each gets its 503.
    pub fn expire(&mut self, now: D) -> Vec<T> {
        let mut out = Vec::new();
        for line in self.lines.values_mut() {
            let (gone, kept): (VecDeque<_>, VecDeque<_>) =
                line.drain(..).partition(|w| w.deadline <= now);
            *line = kept;
            out.extend(gone.into_iter().map(|w| w.item));
        }
        self.lines.retain(|_, l| !l.is_empty());
        out
    }

    /// Takes waiter `id` of `model` out (its client gave up).
    pub fn remove(&mut self, model: &str, id: u64) -> Option<T> {
        let line = self.lines.get_mut(model)?;
        let at = line.iter().position(|w| w.id == id)?;
        let w = line.remove(at)?;
        if line.is_empty() {
            self.lines.remove(model);
        }
        Some(w.item)
    }

    /// Waiting for `model`.
    pub fn len(&self, model: &str) -> usize {
        self.lines.get(model).map_or(0, VecDeque::len)
    }

    /// Waiting per model, for the gauge and the operator.
    pub fn counts(&self) -> impl Iterator<Item = (&str, usize)> {
        self.lines.iter().map(|(m, l)| (m.as_str(), l.len()))
    }

    /// The earliest deadline, when the next [`Pending::expire`] is due.
    pub fn next_deadline(&self) -> Option<D> {
        self.lines
            .values()
            .flat_map(|l| l.iter().map(|w| w.deadline))
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_per_model_and_first_come_first_out() {
        let mut p: Pending<&str, u64> = Pending::new(2);
        p.push("m", "r1", 10).unwrap();
        p.push("m", "r2", 10).unwrap();
        let e = p.push("m", "r3", 10).unwrap_err();
        assert!(matches!(e, RouterError::QueueFull { limit: 2, .. }), "{e}");
        // Another model's line is its own.
        p.push("other", "o1", 10).unwrap();
        assert_eq!((p.len("m"), p.len("other"), p.len("none")), (2, 1, 0));
        assert_eq!(p.release("m", 5), vec!["r1", "r2"]);
        assert_eq!(p.len("m"), 0);
        assert_eq!(p.release("m", 5), Vec::<&str>::new());
        // Room again after the release.
        p.push("m", "r4", 10).unwrap();
        assert_eq!(p.counts().collect::<Vec<_>>(), vec![("m", 1), ("other", 1)]);
    }

    #[test]
    fn each_request_times_out_at_its_own_deadline() {
        let mut p: Pending<u32, u64> = Pending::new(8);
        for (item, deadline) in [(1, 30), (2, 10), (3, 20), (4, 10)] {
            p.push("m", item, deadline).unwrap();
        }
        assert_eq!(p.next_deadline(), Some(10));
        assert_eq!(p.expire(9), Vec::<u32>::new());
        // At the deadline is past it; arrival order among the expired.
        assert_eq!(p.expire(10), vec![2, 4]);
        assert_eq!(p.next_deadline(), Some(20));
        // A release at 25 takes the live one only; the expired stays for expire.
        assert_eq!(p.release("m", 25), vec![1]);
        assert_eq!(p.expire(25), vec![3]);
        assert_eq!(p.next_deadline(), None);
    }

    #[test]
    fn a_client_that_gives_up_leaves_the_line() {
        let mut p: Pending<u32, u64> = Pending::new(8);
        let a = p.push("m", 1, 10).unwrap();
        let b = p.push("m", 2, 10).unwrap();
        assert_eq!(p.remove("m", a), Some(1));
        assert_eq!(p.remove("m", a), None);
        assert_eq!(p.remove("x", b), None);
        assert_eq!(p.release("m", 0), vec![2]);
    }
}
