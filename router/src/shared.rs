//! The state the router's tasks share: the endpoint table and the waiting
//! line behind locks held only for pure steps, the upstream client, the
//! metrics, and what the flags decided.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferrox_core::ApiKeys;
use ferrox_plan::TierWeights;
use ferrox_plan::contract::router::PendingReport;
use ferrox_router::{Bounds, Metrics, Pending, Table};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::prompters::Prompters;

/// What the flags decided.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The load bounds of the choice rule.
    pub bounds: Bounds,
    /// CHWBL's load factor.
    pub load_factor: f64,
    /// How long a routed chain counts as held before the server reports it.
    pub expect_ttl: Duration,
    /// How long a request waits for a ready endpoint.
    pub wait_timeout: Duration,
    /// Largest request body.
    pub max_body: usize,
    /// How often each endpoint's KV events and load are read.
    pub poll_interval: Duration,
    /// What a prompt block held in each KV tier counts for.
    pub tier_weights: TierWeights,
}

/// Shared by every task. Cheap to clone.
#[derive(Clone)]
pub struct Shared {
    inner: Arc<Inner>,
}

struct Inner {
    table: Mutex<Table<Instant>>,
    pending: Mutex<Pending<oneshot::Sender<()>, Instant>>,
    pollers: Mutex<BTreeMap<(String, String), JoinHandle<()>>>,
    report: watch::Sender<PendingReport>,
    client: reqwest::Client,
    metrics: Metrics,
    prompters: Prompters,
    keys: ApiKeys,
    settings: Settings,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every step under these locks is pure and leaves the state whole.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// State with no models yet.
    pub fn new(settings: Settings, keys: ApiKeys, max_pending: usize) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .build()?;
        Ok(Shared {
            inner: Arc::new(Inner {
                table: Mutex::new(Table::with_weights(settings.tier_weights)),
                pending: Mutex::new(Pending::new(max_pending)),
                pollers: Mutex::new(BTreeMap::new()),
                report: watch::Sender::new(PendingReport {
                    version: start_version(),
                    models: BTreeMap::new(),
                }),
                client,
                metrics: Metrics::new()?,
                prompters: Prompters::default(),
                keys,
                settings,
            }),
        })
    }

    /// The endpoint table, locked.
    pub fn table(&self) -> MutexGuard<'_, Table<Instant>> {
        lock(&self.inner.table)
    }

    /// The waiting line, locked.
    pub fn pending(&self) -> MutexGuard<'_, Pending<oneshot::Sender<()>, Instant>> {
        lock(&self.inner.pending)
    }

    /// The upstream client.
    pub fn client(&self) -> &reqwest::Client {
        &self.inner.client
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The built prompt recipes, shared by endpoints with the same spec.
    pub fn prompters(&self) -> &Prompters {
        &self.inner.prompters
    }

    /// The API keys clients must present.
    pub fn keys(&self) -> &ApiKeys {
        &self.inner.keys
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The running pollers, by (model, url).
    pub fn pollers(&self) -> MutexGuard<'_, BTreeMap<(String, String), JoinHandle<()>>> {
        lock(&self.inner.pollers)
    }

    /// Lets every live waiter of `model` go when it has a ready endpoint.
    pub fn wake(&self, model: &str) {
        if !self.table().has_ready(model) {
            return;
        }
        let released = self.pending().release(model, Instant::now());
        for tx in released {
            // A waiter that gave up has dropped its receiver: nothing to do.
            let _ = tx.send(());
        }
        self.publish_pending(model);
    }

    /// Sets the waiting gauge of `model` and, when it moved, the report
    /// the operator long-polls (`GET /pending`).
    pub fn publish_pending(&self, model: &str) {
        let n = self.pending().len(model);
        self.metrics().set_pending(model, n);
        self.inner.report.send_if_modified(|r| {
            let n = n as u64;
            if r.models.get(model).copied().unwrap_or(0) == n {
                return false;
            }
            if n == 0 {
                r.models.remove(model);
            } else {
                r.models.insert(model.to_string(), n);
            }
            r.version += 1;
            true
        });
    }

    /// The waiting-line report, watched.
    pub fn pending_report(&self) -> watch::Receiver<PendingReport> {
        self.inner.report.subscribe()
    }

    /// Ends every held long-poll now (shutting down): a new version.
    pub fn release_long_polls(&self) {
        self.inner.report.send_modify(|r| r.version += 1);
    }
}

/// The first report version: the start time in milliseconds, so a
/// restarted router never repeats a version a poller already saw.
fn start_version() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
