//! A CPU step on rayon's pool with the other workers kept awake.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long a warm worker goes without finding work before it lets rayon
/// put it to sleep: far longer than the gap between two parallel loops of a
/// step, and the most a keeper can hold up a job it was stolen on top of.
const IDLE: Duration = Duration::from_millis(1);

thread_local! {
    /// Whether this thread already keeps warm (a keeper never nests).
    static KEEPING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` on a pool worker while every other worker spins on the pool's
/// queues ([`rayon::yield_now`]) instead of sleeping on a futex between
/// the step's parallel loops: at one decode row a step is a few hundred
/// loops of 50-300 us, and each wake-up cost a worker tens of microseconds.
pub(crate) fn on_warm_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let done = &AtomicBool::new(false);
    rayon::scope(|s| {
        let owner = rayon::current_thread_index();
        for _ in 1..rayon::current_num_threads() {
            s.spawn(move |_| keep_warm(done, owner));
        }
        let out = f();
        done.store(true, Ordering::Release);
        out
    })
}

/// Executes the pool's pending jobs until `done`, or until idle for
/// [`IDLE`]. Returns at once on the step's own thread (it popped its own
/// keeper while waiting in a join) and on a thread already keeping warm.
fn keep_warm(done: &AtomicBool, owner: Option<usize>) {
    if rayon::current_thread_index() == owner || KEEPING.get() {
        return;
    }
    KEEPING.set(true);
    let mut idle_since: Option<Instant> = None;
    let mut spins = 0u32;
    while !done.load(Ordering::Acquire) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => idle_since = None,
            Some(rayon::Yield::Idle) => {
                std::hint::spin_loop();
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(64)
                    && idle_since.get_or_insert_with(Instant::now).elapsed() > IDLE
                {
                    break;
                }
            }
            None => break,
        }
    }
    KEEPING.set(false);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a test pool")
    }

    #[test]
    fn the_step_runs_on_a_worker_and_the_other_workers_run_its_loops_warm() {
        // Loops long enough that a sleeping worker wakes within the step.
        const N: u64 = 1 << 16;
        for threads in [1, 2, 4] {
            let pool = pool(threads);
            let mut warm = 0;
            for _ in 0..50 {
                let (on_worker, sum, kept) = pool.install(|| {
                    on_warm_pool(|| {
                        let owner = rayon::current_thread_index();
                        let mut sum = 0u64;
                        let mut kept = 0;
                        // A step's shape: many short loops, one after another.
                        for op in 0..20u64 {
                            let (s, k) = (0..N)
                                .into_par_iter()
                                .map(|i| {
                                    let away = rayon::current_thread_index() != owner;
                                    (
                                        std::hint::black_box(i) * op,
                                        usize::from(away && KEEPING.get()),
                                    )
                                })
                                .reduce(|| (0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
                            sum += s;
                            kept += k;
                        }
                        (owner.is_some(), sum, kept)
                    })
                });
                assert!(on_worker);
                assert_eq!(sum, (0..20u64).sum::<u64>() * (0..N).sum::<u64>());
                warm += kept;
            }
            // The other workers took the loops' work while keeping warm
            // (not woken from sleep for each loop).
            assert_eq!(warm > 0, threads > 1, "{threads} threads");
        }
    }

    #[test]
    fn keepers_return_when_the_step_ends_and_never_nest() {
        // Steps from several threads at once share the pool's keepers; each
        // returns, so the pool goes on running other work afterwards.
        let pool = pool(3);
        std::thread::scope(|s| {
            for k in 0..4u64 {
                let pool = &pool;
                s.spawn(move || {
                    for _ in 0..25 {
                        let got = pool.install(|| {
                            on_warm_pool(|| {
                                (0..1000u64).into_par_iter().map(|i| i + k).sum::<u64>()
                            })
                        });
                        assert_eq!(got, (0..1000u64).sum::<u64>() + 1000 * k);
                    }
                });
            }
        });
        assert!(!KEEPING.get(), "the caller's thread never keeps warm");
        let after: u64 = pool.install(|| (0..100u64).into_par_iter().sum());
        assert_eq!(after, 4950);
    }
}
