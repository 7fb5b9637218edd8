//! How busy an endpoint is, and the bounds past which it takes no new work
//! while another endpoint has room.

/// One endpoint's load as the router knows it: its own in-flight count and
/// the server's last reported queue and KV usage.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Load {
    /// Requests this router has sent there and not seen end.
    pub in_flight: usize,
    /// The server's waiting line (`vllm:num_requests_waiting`).
    pub waiting: usize,
    /// Reserved KV blocks over the pool (`vllm:kv_cache_usage_perc`, 0..=1).
    pub kv_usage: f64,
}

/// The load bound of the choice rule: an endpoint over any of these takes a
/// request only when every ready endpoint is over one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    /// Most requests waiting in the server's own line.
    pub max_waiting: usize,
    /// Most KV usage (0..=1); admission reserves a request's whole life, so
    /// near 1 a new request waits.
    pub max_kv_usage: f64,
    /// Most requests in flight from this router.
    pub max_in_flight: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        // A waiting line of a few means the replica's batch is full; 0.9
        // leaves room for the requests already admitted to grow.
        Bounds {
            max_waiting: 4,
            max_kv_usage: 0.9,
            max_in_flight: 64,
        }
    }
}

impl Bounds {
    /// True when `load` is past any bound (a bound is inclusive: at it is fine).
    pub fn exceeded_by(&self, load: &Load) -> bool {
        load.waiting > self.max_waiting
            || load.kv_usage > self.max_kv_usage
            || load.in_flight > self.max_in_flight
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bound_alone_counts_and_at_the_bound_is_within() {
        let b = Bounds {
            max_waiting: 2,
            max_kv_usage: 0.5,
            max_in_flight: 3,
        };
        let at = Load {
            in_flight: 3,
            waiting: 2,
            kv_usage: 0.5,
        };
        let cases = [
            (at, false),
            (Load { waiting: 3, ..at }, true),
            (
                Load {
                    kv_usage: 0.51,
                    ..at
                },
                true,
            ),
            (Load { in_flight: 4, ..at }, true),
            (Load::default(), false),
        ];
        for (load, want) in cases {
            assert_eq!(b.exceeded_by(&load), want, "{load:?}");
        }
    }
}
