//! Endpoints from Kubernetes: ModelDeployments name the models (their
//! servedName, else their name), and the EndpointSlices of their Services
//! (named like them, labelled by the operator) list the ready pods. Both
//! watched; every change recomputes the whole set.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, ResourceExt};

use crate::shared::Shared;

/// The label the operator puts on what it renders (copied to the slices
/// from the Service).
const MANAGED_BY: &str = "app.kubernetes.io/managed-by=ferrox-operator";
/// The label Kubernetes puts on a Service's EndpointSlices.
const SERVICE_NAME: &str = "kubernetes.io/service-name";

/// Watches until the watch streams end (they retry inside).
pub async fn run(s: Shared, namespace: Option<String>) -> anyhow::Result<()> {
    let client = Client::try_default().await?;
    let gvk = GroupVersionKind::gvk("ferrox.dev", "v1alpha1", "ModelDeployment");
    let resource = ApiResource::from_gvk(&gvk);
    let (mds, slices): (Api<DynamicObject>, Api<EndpointSlice>) = match &namespace {
        Some(ns) => (
            Api::namespaced_with(client.clone(), ns, &resource),
            Api::namespaced(client, ns),
        ),
        None => (Api::all_with(client.clone(), &resource), Api::all(client)),
    };
    let md_writer = reflector::store::Writer::new(resource.clone());
    let md_store = md_writer.as_reader();
    let (slice_store, slice_writer) = reflector::store();
    // Every event, deletions included, recomputes the set.
    let md_events = reflector(md_writer, watcher(mds, watcher::Config::default()))
        .default_backoff()
        .map(|r| r.map(|_| ()).map_err(|e| e.to_string()));
    let slice_cfg = watcher::Config::default().labels(MANAGED_BY);
    let slice_events = reflector(slice_writer, watcher(slices, slice_cfg))
        .default_backoff()
        .map(|r| r.map(|_| ()).map_err(|e| e.to_string()));
    let mut events = std::pin::pin!(futures::stream::select(md_events, slice_events));
    while let Some(event) = events.next().await {
        if let Err(e) = event {
            tracing::warn!(error = %e, "watch error");
            continue;
        }
        let mds: Vec<_> = md_store.state();
        let slices: Vec<_> = slice_store.state();
        s.table()
            .declare_adapters(declared(mds.iter().map(|m| m.as_ref())));
        crate::poller::sync(
            &s,
            &wanted(
                mds.iter().map(|m| m.as_ref()),
                slices.iter().map(|e| e.as_ref()),
            ),
        );
    }
    Ok(())
}

/// The LoRA adapters the ModelDeployments declare (`spec.adapters[].name`):
/// adapter -> served model.
fn declared<'a>(mds: impl Iterator<Item = &'a DynamicObject>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for md in mds {
        let model = md.data["spec"]["model"]["servedName"]
            .as_str()
            .map_or_else(|| md.name_any(), str::to_string);
        let adapters = md.data["spec"]["adapters"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for a in adapters {
            if let Some(name) = a["name"].as_str() {
                out.insert(name.to_string(), model.clone());
            }
        }
    }
    out
}

/// The endpoint set: served model -> [(url, ready)], ready pods only.
fn wanted<'a>(
    mds: impl Iterator<Item = &'a DynamicObject>,
    slices: impl Iterator<Item = &'a EndpointSlice>,
) -> BTreeMap<String, Vec<(String, bool)>> {
    let mut served: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut out: BTreeMap<String, Vec<(String, bool)>> = BTreeMap::new();
    for md in mds {
        let name = md.name_any();
        let model = md.data["spec"]["model"]["servedName"]
            .as_str()
            .map_or_else(|| name.clone(), str::to_string);
        served.insert((md.namespace().unwrap_or_default(), name), model.clone());
        out.entry(model).or_default();
    }
    for slice in slices {
        let Some(service) = slice.labels().get(SERVICE_NAME) else {
            continue;
        };
        let key = (slice.namespace().unwrap_or_default(), service.clone());
        let Some(model) = served.get(&key) else {
            continue;
        };
        let ports = slice.ports.as_deref().unwrap_or_default();
        let port = ports
            .iter()
            .find(|p| p.name.as_deref() == Some("http"))
            .or_else(|| ports.first())
            .and_then(|p| p.port);
        let Some(port) = port else { continue };
        let list = out.entry(model.clone()).or_default();
        for ep in &slice.endpoints {
            let c = ep.conditions.as_ref();
            // Kubernetes: an unknown readiness reads as ready.
            let ready = c.and_then(|c| c.ready).unwrap_or(true)
                && !c.and_then(|c| c.terminating).unwrap_or(false);
            if !ready {
                continue;
            }
            for addr in &ep.addresses {
                let host = if addr.contains(':') {
                    format!("[{addr}]")
                } else {
                    addr.clone()
                };
                list.push((format!("http://{host}:{port}"), true));
            }
        }
    }
    for list in out.values_mut() {
        list.sort();
        list.dedup();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
    use serde_json::json;

    fn md(name: &str, served: Option<&str>) -> DynamicObject {
        let gvk = GroupVersionKind::gvk("ferrox.dev", "v1alpha1", "ModelDeployment");
        let mut o = DynamicObject::new(name, &ApiResource::from_gvk(&gvk)).within("ns");
        o.data = json!({"spec": {"model": {"servedName": served}}});
        o
    }

    fn endpoint(addr: &str, ready: Option<bool>, terminating: bool) -> Endpoint {
        Endpoint {
            addresses: vec![addr.into()],
            conditions: Some(EndpointConditions {
                ready,
                terminating: Some(terminating),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn slice(service: &str, endpoints: Vec<Endpoint>) -> EndpointSlice {
        let mut s = EndpointSlice {
            address_type: "IPv4".into(),
            endpoints,
            ports: Some(vec![EndpointPort {
                name: Some("http".into()),
                port: Some(8000),
                ..Default::default()
            }]),
            ..Default::default()
        };
        s.metadata.namespace = Some("ns".into());
        s.metadata.labels = Some([(SERVICE_NAME.to_string(), service.to_string())].into());
        s
    }

    #[test]
    fn ready_pods_of_known_services_under_the_served_name() {
        let mds = [md("smol", Some("smollm2")), md("idle", None)];
        let slices = [
            slice(
                "smol",
                vec![
                    endpoint("10.0.0.1", Some(true), false),
                    endpoint("10.0.0.2", Some(false), false),
                    endpoint("10.0.0.3", Some(true), true),
                    endpoint("fd00::4", None, false),
                ],
            ),
            slice("stranger", vec![endpoint("10.0.0.9", Some(true), false)]),
        ];
        let w = wanted(mds.iter(), slices.iter());
        assert_eq!(
            w["smollm2"],
            vec![
                ("http://10.0.0.1:8000".to_string(), true),
                ("http://[fd00::4]:8000".to_string(), true)
            ]
        );
        assert_eq!(w["idle"], vec![], "known at zero replicas");
        assert_eq!(w.len(), 2);
    }

    #[test]
    fn adapters_are_declared_under_their_models_served_name() {
        let mut with = md("smol", Some("smollm2"));
        with.data["spec"]["adapters"] =
            json!([{"name": "sql", "source": "hf://o/sql"}, {"name": "chat"}]);
        let mds = [with, md("idle", None)];
        let d = declared(mds.iter());
        assert_eq!(d.len(), 2);
        assert_eq!(
            (d["sql"].as_str(), d["chat"].as_str()),
            ("smollm2", "smollm2")
        );
    }
}
