//! ferrox-router, as the operator sees it: where it is (`service`), what its
//! replicas say is waiting (`board`, filled by the long-polls in `poll`), and
//! the pure rule that wakes a model scaled to zero (`wake`).

pub mod board;
pub mod poll;
pub mod service;
pub mod wake;

pub use board::PendingBoard;
pub use service::RouterService;
