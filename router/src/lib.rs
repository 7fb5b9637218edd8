//! ferrox-router: the data plane in front of every ModelDeployment's
//! servers. It holds requests while a model has no ready replica
//! ([`pending`]), and sends each request to the replica holding the longest
//! run of its prompt's KV blocks, bounded by load ([`choice`], [`holdings`];
//! [`chwbl`] when the model's tokenizer is not known).
//!
//! The modules here are the functional core: no I/O, no clock reads
//! ([`table`] holds the endpoints, [`request_view`] reads a body,
//! [`retry`] decides whether a failed send goes elsewhere,
//! [`metrics`] renders the series). The binary (`main.rs` and its shell
//! modules) watches endpoints, polls the servers and proxies.

pub mod choice;
pub mod chwbl;
pub mod error;
pub mod holdings;
pub mod load;
pub mod lower_tiers;
pub mod metrics;
pub mod pending;
pub mod request_view;
pub mod retry;
pub mod table;

pub use choice::{Affinity, Candidate, Decision, Reason, choose, choose_weighted};
pub use error::RouterError;
pub use holdings::Holdings;
pub use load::{Bounds, Load};
pub use lower_tiers::LowerTiers;
pub use metrics::Metrics;
pub use pending::Pending;
pub use request_view::RequestView;
pub use retry::{Retries, SendFailure};
pub use table::{Changes, Endpoint, RouteSettings, Table, Target};
