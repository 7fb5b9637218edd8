//! The fast path from zero: every change of the routers' waiting counts
//! (the long-polls in `router::poll` fill the board as requests queue)
//! wakes the built-in-autoscaled models at zero that someone waits for,
//! without waiting for the next scrape. The scrape loop applies the same
//! rule (`router::wake::wakes`) each tick, so a change missed here (an API
//! error) is caught there.

use std::sync::Arc;

use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::decision::Decision;
use super::observation::Observation;
use super::run::{act, write_status};
use crate::Error;
use crate::crd::ModelDeployment;
use crate::reconcile::Context;
use crate::router::PendingBoard;
use crate::router::wake::to_wake;

/// Wakes on every change of `board` until the board is dropped.
pub async fn run(ctx: Arc<Context>, board: PendingBoard) {
    let mut changes = board.subscribe();
    while changes.changed().await.is_ok() {
        let totals = board.totals();
        if totals.is_empty() {
            continue;
        }
        let api: Api<ModelDeployment> = Api::all(ctx.client.clone());
        let mds = match api.list(&ListParams::default()).await {
            Ok(l) => l.items,
            Err(e) => {
                tracing::warn!(error = %e, "waker: list ModelDeployments");
                continue;
            }
        };
        for (md, pending) in to_wake(&mds, &totals) {
            if let Err(e) = wake(&ctx, md, pending).await {
                tracing::warn!(name = %md.name_any(), error = %e, "waker");
            }
        }
    }
}

async fn wake(ctx: &Context, md: &ModelDeployment, pending: u64) -> Result<(), Error> {
    let ns = md.namespace().ok_or(Error::Missing("metadata.namespace"))?;
    let api: Api<ModelDeployment> = Api::namespaced(ctx.client.clone(), &ns);
    let obs = Observation {
        pending: pending as f64,
        ..Default::default()
    };
    let (status, _) = act(ctx, &api, md, &Decision::wake(pending), &obs).await?;
    tracing::info!(name = %md.name_any(), pending, "woke from zero");
    let observed = md.status.as_ref().and_then(|s| s.observed_plan.as_ref());
    // Everything this field manager owns, or the apply would drop it.
    let adapters = md
        .status
        .as_ref()
        .map_or(&[][..], |s| s.adapters.as_slice());
    let tiers = (md.status.as_ref()).map_or(&[][..], |s| s.kv_tiers.as_slice());
    write_status(&api, md, Some(&status), observed, (adapters, tiers), None).await
}
