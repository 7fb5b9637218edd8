//! The built-in autoscaler, one file per role: the pure decision, the scrape
//! of the servers' `/metrics`, the loop that acts on both. The external
//! autoscalers' objects (HPA, KEDA) are desired objects (`desired::autoscaler`).

pub mod decision;
pub mod idle;
pub mod observation;
pub mod run;
pub mod scrape;
pub mod waker;
