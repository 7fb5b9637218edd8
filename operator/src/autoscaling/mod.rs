//! Autoscaling, one file per role: the pure decision, the scrape of the
//! servers' `/metrics`, the loop that acts on both, and the external
//! autoscalers' objects (HPA, KEDA).

pub mod decision;
pub mod external;
pub mod run;
pub mod scrape;
