//! Reconcile against a scripted API server.

use std::sync::Arc;

use http::Method;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;

use super::*;
use crate::crd::{GeometrySpec, ModelDeploymentStatus};
use crate::fixtures::{self, cpu_spec, gpu_spec, md};
use crate::verifier::{ApiServerVerifier, echo, mock_client, not_found};

const NS: &str = "/apis/ferrox.dev/v1alpha1/namespaces/default/modeldeployments";

fn fixed_clock() -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap())
}

fn context() -> (Arc<Context>, ApiServerVerifier) {
    let (client, verifier) = mock_client();
    let ctx = Context::new(client, DesiredConfig::default(), Arc::default(), None)
        .with_clock(fixed_clock);
    (Arc::new(ctx), verifier)
}

fn smollm2() -> ModelDeployment {
    let mut spec = cpu_spec("2Gi");
    spec.model.geometry = Some(GeometrySpec::from(&fixtures::smollm2_135m()));
    md("smol", spec)
}

fn condition<'a>(status: &'a Value, type_: &str) -> (&'a str, &'a str) {
    let c = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap();
    (c["status"].as_str().unwrap(), c["reason"].as_str().unwrap())
}

/// Answers a status apply with the whole object, as the server does.
fn status_echo(md: &ModelDeployment) -> impl FnOnce(&Value) -> (http::StatusCode, Value) + use<> {
    let mut whole = serde_json::to_value(md).unwrap();
    move |body| {
        whole["status"] = body["status"].clone();
        (http::StatusCode::OK, whole)
    }
}

/// The lookups of optional children a new generation triggers (none exist).
async fn expect_no_stale_children(v: &mut ApiServerVerifier, name: &str) {
    for path in [
        "/apis/policy/v1/namespaces/default/poddisruptionbudgets",
        "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers",
        "/apis/keda.sh/v1alpha1/namespaces/default/scaledobjects",
        "/apis/inference.networking.k8s.io/v1/namespaces/default/inferencepools",
    ] {
        v.expect(Method::GET, &format!("{path}/{name}"), not_found)
            .await;
    }
    let claim = format!("/api/v1/namespaces/default/persistentvolumeclaims/{name}-kv-cache");
    v.expect(Method::GET, &claim, not_found).await;
}

/// Runs reconcile beside a scenario; returns the scenario's output.
async fn run<T>(
    md: ModelDeployment,
    scenario: impl AsyncFnOnce(&mut ApiServerVerifier) -> T,
) -> (Result<Action, Error>, T) {
    let (ctx, mut verifier) = context();
    let server = async {
        let out = scenario(&mut verifier).await;
        verifier.expect_silence().await;
        out
    };
    let both = async {
        tokio::join!(
            async {
                let r = reconcile(Arc::new(md), ctx).await;
                if let Err(e) = &r {
                    eprintln!("reconcile failed: {e:?}");
                }
                r
            },
            server
        )
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), both)
        .await
        .expect("scenario finished in time")
}

#[tokio::test]
async fn a_model_deployment_being_deleted_gets_no_writes() {
    let mut deleting = smollm2();
    deleting.metadata.deletion_timestamp = Some(fixed_clock());
    // The verifier fails on any call at all.
    let (result, ()) = run(deleting, async |_: &mut ApiServerVerifier| {}).await;
    assert_eq!(result.unwrap(), Action::await_change());
}

#[tokio::test]
async fn first_reconcile_applies_children_and_writes_status() {
    let (result, status) = run(smollm2(), async |v: &mut ApiServerVerifier| {
        let dep = v
            .expect(
                Method::PATCH,
                "/apis/apps/v1/namespaces/default/deployments/smol?",
                echo,
            )
            .await;
        assert!(dep.uri.contains("fieldManager=ferrox-operator"));
        assert!(dep.uri.contains("force=true"));
        let args = dep.body["spec"]["template"]["spec"]["containers"][0]["args"].clone();
        let args = args.as_array().unwrap();
        let pool = args.iter().position(|a| a == "--pool").unwrap();
        assert!(
            args[pool + 1].as_str().unwrap().starts_with("full="),
            "{args:?}"
        );
        assert_eq!(
            dep.body["metadata"]["ownerReferences"][0]["kind"],
            "ModelDeployment"
        );
        v.expect(
            Method::PATCH,
            "/api/v1/namespaces/default/services/smol?",
            echo,
        )
        .await;
        expect_no_stale_children(v, "smol").await;
        let st = v
            .expect(
                Method::PATCH,
                &format!("{NS}/smol/status?"),
                status_echo(&smollm2()),
            )
            .await;
        let ev = v
            .expect(
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/default/events",
                echo,
            )
            .await;
        assert_eq!(ev.body["reason"], "Planned");
        st.body["status"].clone()
    })
    .await;
    result.expect("reconcile ok");
    assert_eq!(condition(&status, "Planned"), ("True", "Planned"));
    assert_eq!(condition(&status, "Ready"), ("False", "ReplicasNotReady"));
    // Memory holds 19; the CPU default (16, the server's own) caps it.
    assert_eq!(status["plan"]["maxSeqs"], 16);
    assert_eq!(status["servedName"], "model");
    assert_eq!(
        condition(&status, "PlanVerified"),
        ("Unknown", "NoServerReports")
    );
    assert_eq!(status["observedGeneration"], 1);
    assert_eq!(
        status["selector"],
        "app.kubernetes.io/instance=smol,app.kubernetes.io/name=ferrox-server"
    );
}

#[tokio::test]
async fn second_reconcile_changes_nothing() {
    // The first pass's status, as the server would now hold it.
    let (_, status) = run(smollm2(), async |v: &mut ApiServerVerifier| {
        v.expect(Method::PATCH, "/apis/apps/v1/", echo).await;
        v.expect(Method::PATCH, "/api/v1/", echo).await;
        expect_no_stale_children(v, "smol").await;
        let st = v.expect(Method::PATCH, NS, status_echo(&smollm2())).await;
        v.expect(Method::POST, "/apis/events.k8s.io/", echo).await;
        st.body["status"].clone()
    })
    .await;
    let mut md = smollm2();
    md.status = Some(serde_json::from_value::<ModelDeploymentStatus>(status).unwrap());
    let (result, ()) = run(md, async |v: &mut ApiServerVerifier| {
        // Applies are idempotent on the server; no status write, no event follows.
        v.expect(
            Method::PATCH,
            "/apis/apps/v1/namespaces/default/deployments/smol?",
            echo,
        )
        .await;
        v.expect(
            Method::PATCH,
            "/api/v1/namespaces/default/services/smol?",
            echo,
        )
        .await;
    })
    .await;
    result.expect("reconcile ok");
}

#[tokio::test]
async fn insufficient_memory_makes_no_pods() {
    let mut spec = gpu_spec(1, "24Gi");
    spec.model.geometry = Some(GeometrySpec::from(&fixtures::llama3_70b()));
    let big = md("big", spec);
    let (result, (status, event)) = run(big.clone(), async move |v: &mut ApiServerVerifier| {
        // The first request is the status: no Deployment was applied.
        let st = v
            .expect(
                Method::PATCH,
                &format!("{NS}/big/status?"),
                status_echo(&big),
            )
            .await;
        let ev = v.expect(Method::POST, "/apis/events.k8s.io/", echo).await;
        (st.body["status"].clone(), ev.body)
    })
    .await;
    result.expect("reconcile ok");
    assert_eq!(
        condition(&status, "Planned"),
        ("False", "InsufficientMemory")
    );
    assert_eq!(
        condition(&status, "Degraded"),
        ("True", "InsufficientMemory")
    );
    assert!(status.get("plan").is_none());
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["reason"], "InsufficientMemory");
    assert!(event["note"].as_str().unwrap().contains("141107412992"));
}

#[tokio::test]
async fn unknown_geometry_starts_an_inspection_job() {
    let md = md("llama", gpu_spec(1, "80Gi"));
    let job = inspect_job::job_name(&md);
    let reply = status_echo(&md);
    let (result, status) = run(md, async move |v: &mut ApiServerVerifier| {
        let path = format!("/apis/batch/v1/namespaces/default/jobs/{job}");
        v.expect(Method::GET, &path, not_found).await;
        let applied = v.expect(Method::PATCH, &path, echo).await;
        assert_eq!(
            applied.body["spec"]["template"]["spec"]["restartPolicy"],
            "Never"
        );
        let st = v.expect(Method::PATCH, NS, reply).await;
        v.expect(Method::POST, "/apis/events.k8s.io/", echo).await;
        st.body["status"].clone()
    })
    .await;
    assert_eq!(
        result.expect("reconcile ok"),
        Action::requeue(std::time::Duration::from_secs(10))
    );
    assert_eq!(condition(&status, "Planned"), ("Unknown", "Inspecting"));
}

#[tokio::test]
async fn a_finished_inspection_is_read_from_the_termination_message() {
    let md = md("smol", cpu_spec("2Gi"));
    let job = inspect_job::job_name(&md);
    let reply = status_echo(&md);
    let inspect = r#"{"architecture":"llama","layers":30,"kvHeads":3,"headDim":64,"kvDtype":"f32","weightBytes":98362432,"contextLength":8192}"#;
    let (result, status) = run(md, async move |v: &mut ApiServerVerifier| {
        v.expect(Method::GET, &format!("/apis/batch/v1/namespaces/default/jobs/{job}"), |_| {
            (http::StatusCode::OK, serde_json::json!({
                "apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": job, "namespace": "default"},
                "status": {"succeeded": 1}
            }))
        })
        .await;
        let pods = v
            .expect(Method::GET, "/api/v1/namespaces/default/pods?", |_| {
                (http::StatusCode::OK, serde_json::json!({
                    "apiVersion": "v1", "kind": "PodList", "metadata": {},
                    "items": [{"metadata": {"name": "p"}, "status": {"containerStatuses": [{
                        "name": "inspect", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                        "state": {"terminated": {"exitCode": 0, "message": inspect}}
                    }]}}]
                }))
            })
            .await;
        assert!(pods.uri.contains("labelSelector=job-name"));
        v.expect(Method::PATCH, "/apis/apps/v1/", echo).await;
        v.expect(Method::PATCH, "/api/v1/", echo).await;
        expect_no_stale_children(v, "smol").await;
        let st = v.expect(Method::PATCH, NS, reply).await;
        v.expect(Method::POST, "/apis/events.k8s.io/", echo).await;
        st.body["status"].clone()
    })
    .await;
    result.expect("reconcile ok");
    assert_eq!(condition(&status, "Planned"), ("True", "Planned"));
    assert_eq!(status["geometry"]["geometry"]["layers"], 30);
    assert_eq!(
        status["geometry"]["source"],
        "file:///models/SmolLM2-135M-Instruct.Q4_1.gguf"
    );
}

#[tokio::test]
async fn api_errors_back_off_exponentially() {
    let (ctx, mut v) = context();
    let server = tokio::spawn(async move {
        v.expect(Method::PATCH, "/apis/apps/v1/", |_| {
            (http::StatusCode::INTERNAL_SERVER_ERROR, serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500, "message": "boom"
            }))
        })
        .await;
    });
    let md = Arc::new(smollm2());
    let err = reconcile(md.clone(), ctx.clone()).await.unwrap_err();
    server.await.unwrap();
    let delays: Vec<_> = (0..3)
        .map(|_| error_policy(md.clone(), &err, ctx.clone()))
        .collect();
    assert_eq!(
        delays,
        [5, 10, 20].map(|s| Action::requeue(std::time::Duration::from_secs(s)))
    );
    assert_eq!(backoff_seconds(30), 300);
}

#[tokio::test]
async fn a_new_generation_prunes_an_owned_stale_pdb() {
    // Generation 1 ran 2 replicas (and so had a PDB); generation 2 runs one.
    let (_, status) = run(smollm2(), async |v: &mut ApiServerVerifier| {
        v.expect(Method::PATCH, "/apis/apps/v1/", echo).await;
        v.expect(Method::PATCH, "/api/v1/", echo).await;
        expect_no_stale_children(v, "smol").await;
        let st = v.expect(Method::PATCH, NS, status_echo(&smollm2())).await;
        v.expect(Method::POST, "/apis/events.k8s.io/", echo).await;
        st.body["status"].clone()
    })
    .await;
    let mut md = smollm2();
    md.status = Some(serde_json::from_value(status).unwrap());
    md.metadata.generation = Some(2);
    let pdb = crate::desired::pdb::pdb(&md).unwrap();
    let (result, status) = run(md, async move |v: &mut ApiServerVerifier| {
        v.expect(Method::PATCH, "/apis/apps/v1/", echo).await;
        v.expect(Method::PATCH, "/api/v1/", echo).await;
        let path = "/apis/policy/v1/namespaces/default/poddisruptionbudgets/smol";
        v.expect(Method::GET, path, |_| {
            (http::StatusCode::OK, serde_json::to_value(&pdb).unwrap())
        })
        .await;
        v.expect(Method::DELETE, path, |_| {
            (http::StatusCode::OK, serde_json::to_value(&pdb).unwrap())
        })
        .await;
        v.expect(Method::GET, "/apis/autoscaling/v2/", not_found)
            .await;
        v.expect(Method::GET, "/apis/keda.sh/v1alpha1/", not_found)
            .await;
        v.expect(
            Method::GET,
            "/apis/inference.networking.k8s.io/v1/",
            not_found,
        )
        .await;
        let claim = "/api/v1/namespaces/default/persistentvolumeclaims/smol-kv-cache";
        v.expect(Method::GET, claim, not_found).await;
        // observedGeneration moves; nothing else does, so no event.
        let st = v.expect(Method::PATCH, NS, status_echo(&smollm2())).await;
        st.body["status"].clone()
    })
    .await;
    result.expect("reconcile ok");
    assert_eq!(status["observedGeneration"], 2);
}

fn context_with_nodes(
    nodes: Vec<k8s_openapi::api::core::v1::Node>,
) -> (Arc<Context>, ApiServerVerifier) {
    let (client, verifier) = mock_client();
    let (reader, mut writer) = kube::runtime::reflector::store();
    for n in nodes {
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(n));
    }
    let ctx = Context::new(client, DesiredConfig::default(), Arc::default(), None)
        .with_clock(fixed_clock)
        .with_nodes(reader);
    (Arc::new(ctx), verifier)
}

/// A GPU spec with the 8B geometry, planning from the nodes' labels.
fn llama_from_nodes(product: &str) -> ModelDeployment {
    let mut spec = gpu_spec(1, "1Gi");
    let acc = spec.accelerator.as_mut().unwrap();
    acc.memory_per_device = None;
    acc.product = Some(product.into());
    spec.tolerations = Some(vec![fixtures::gpu_toleration()]);
    spec.model.geometry = Some(GeometrySpec::from(&fixtures::llama3_8b()));
    md("llama", spec)
}

async fn refused_status(md: ModelDeployment, ctx: Arc<Context>, mut v: ApiServerVerifier) -> Value {
    let reply = status_echo(&md);
    let server = async move {
        // No Deployment: the status is the first call.
        let st = v
            .expect(Method::PATCH, &format!("{NS}/llama/status?"), reply)
            .await;
        let ev = v.expect(Method::POST, "/apis/events.k8s.io/", echo).await;
        assert_eq!(ev.body["type"], "Warning");
        v.expect_silence().await;
        st.body["status"].clone()
    };
    let (result, status) = tokio::join!(reconcile(Arc::new(md), ctx), server);
    result.expect("reconcile ok");
    status
}

#[tokio::test]
async fn gpu_memory_comes_from_the_matching_nodes() {
    let nodes = vec![
        fixtures::gpu_node("h100-a", "NVIDIA-H100-80GB-HBM3", 81_559, 8),
        fixtures::gpu_node("l4-a", "NVIDIA-L4", 23_034, 4),
    ];
    let (ctx, mut v) = context_with_nodes(nodes);
    let md = llama_from_nodes("NVIDIA-H100-80GB-HBM3");
    let reply = status_echo(&md);
    let server = async move {
        v.expect(Method::PATCH, "/apis/apps/v1/", echo).await;
        v.expect(Method::PATCH, "/api/v1/", echo).await;
        expect_no_stale_children(&mut v, "llama").await;
        let st = v.expect(Method::PATCH, NS, reply).await;
        v.expect(Method::POST, "/apis/events.k8s.io/", echo).await;
        st.body["status"].clone()
    };
    let (result, status) = tokio::join!(reconcile(Arc::new(md), ctx), server);
    result.expect("reconcile ok");
    assert_eq!(condition(&status, "Planned"), ("True", "Planned"));
    assert_eq!(status["accelerator"]["product"], "NVIDIA-H100-80GB-HBM3");
    assert_eq!(
        status["accelerator"]["memoryPerDeviceBytes"],
        81_559i64 << 20
    );
    assert_eq!(status["accelerator"]["memoryFrom"], "nodes");
    assert_eq!(status["accelerator"]["nodes"], 1);
    assert_eq!(status["plan"]["memoryBytes"], 81_559i64 << 20);
    assert_eq!(status["plan"]["device"], "cuda");
}

#[tokio::test]
async fn no_matching_node_is_refused_with_what_was_looked_for() {
    let nodes = vec![fixtures::gpu_node("l4-a", "NVIDIA-L4", 23_034, 4)];
    let (ctx, v) = context_with_nodes(nodes);
    let status = refused_status(llama_from_nodes("NVIDIA-H100-80GB-HBM3"), ctx, v).await;
    assert_eq!(condition(&status, "Planned"), ("False", "NoMatchingNodes"));
    let message = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Planned")
        .unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"),
        "{message}"
    );
    assert!(
        message.contains("l4-a: nvidia.com/gpu.product=NVIDIA-L4"),
        "{message}"
    );
}

#[tokio::test]
async fn more_than_one_gpu_is_refused_as_tensor_parallel() {
    let (ctx, v) = context_with_nodes(vec![]);
    let mut md = llama_from_nodes("NVIDIA-H100-80GB-HBM3");
    md.spec.accelerator.as_mut().unwrap().count = 4;
    let status = refused_status(md, ctx, v).await;
    assert_eq!(
        condition(&status, "Planned"),
        ("False", "TensorParallelUnsupported")
    );
    assert_eq!(
        condition(&status, "Degraded"),
        ("True", "TensorParallelUnsupported")
    );
}

#[tokio::test]
async fn pending_pods_say_why_in_ready() {
    let (ctx, mut v) = context();
    let md = smollm2();
    let reply = status_echo(&md);
    let server = async move {
        v.expect(Method::PATCH, "/apis/apps/v1/", |body| {
            let mut d = body.clone();
            d["status"] = serde_json::json!({"replicas": 1, "readyReplicas": 0, "updatedReplicas": 1, "unavailableReplicas": 1});
            (http::StatusCode::OK, d)
        })
        .await;
        v.expect(Method::PATCH, "/api/v1/", echo).await;
        expect_no_stale_children(&mut v, "smol").await;
        let pods = v
            .expect(Method::GET, "/api/v1/namespaces/default/pods?", |_| {
                (http::StatusCode::OK, serde_json::json!({
                    "apiVersion": "v1", "kind": "PodList", "metadata": {},
                    "items": [{"metadata": {"name": "p"}, "status": {"phase": "Pending", "conditions": [{
                        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
                    }]}}]
                }))
            })
            .await;
        assert!(
            pods.uri.contains("labelSelector=app.kubernetes.io"),
            "{}",
            pods.uri
        );
        let st = v.expect(Method::PATCH, NS, reply).await;
        v.expect(Method::POST, "/apis/events.k8s.io/", echo).await;
        st.body["status"].clone()
    };
    let (result, status) = tokio::join!(reconcile(Arc::new(md), ctx), server);
    result.expect("reconcile ok");
    assert_eq!(condition(&status, "Ready"), ("False", "PodsUnschedulable"));
    let ready = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("1 unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."),
        "{ready}"
    );
}

fn with_disk_tier(mut md: ModelDeployment, class: Option<&str>) -> ModelDeployment {
    use crate::crd::{KvCacheSpec, KvDiskSpec, KvOffloadSpec};
    md.spec.kv_cache = Some(KvCacheSpec {
        offload: Some(KvOffloadSpec {
            host_memory: None,
            disk: Some(KvDiskSpec {
                size: k8s_openapi::apimachinery::pkg::api::resource::Quantity("10Gi".into()),
                storage_class_name: class.map(str::to_string),
                access_mode: "ReadWriteOnce".into(),
                empty_dir: None,
            }),
        }),
    });
    md
}

#[tokio::test]
async fn a_disk_tier_s_claim_is_applied_before_the_pods_that_mount_it() {
    let md = with_disk_tier(smollm2(), Some("fast"));
    let (result, ()) = run(md.clone(), async move |v: &mut ApiServerVerifier| {
        let path = "/api/v1/namespaces/default/persistentvolumeclaims/smol-kv-cache?";
        let claim = v.expect(Method::PATCH, path, echo).await;
        assert!(claim.uri.contains("fieldManager=ferrox-operator"));
        assert_eq!(claim.body["spec"]["storageClassName"], "fast");
        assert_eq!(
            claim.body["metadata"]["ownerReferences"][0]["kind"],
            "ModelDeployment"
        );
        let dep = v.expect(Method::PATCH, "/apis/apps/v1/", echo).await;
        let pod = &dep.body["spec"]["template"]["spec"];
        let vol = (pod["volumes"].as_array().unwrap().iter())
            .find(|v| v["name"] == "kv-cache")
            .unwrap();
        assert_eq!(vol["persistentVolumeClaim"]["claimName"], "smol-kv-cache");
        v.expect(Method::PATCH, "/api/v1/", echo).await;
        // Asked for now, so not pruned: the lookups skip it.
        for path in [
            "/apis/policy/v1/",
            "/apis/autoscaling/v2/",
            "/apis/keda.sh/v1alpha1/",
            "/apis/inference.networking.k8s.io/v1/",
        ] {
            v.expect(Method::GET, path, not_found).await;
        }
        v.expect(Method::PATCH, NS, status_echo(&md)).await;
        v.expect(Method::POST, "/apis/events.k8s.io/", echo).await;
    })
    .await;
    result.expect("reconcile ok");
}

#[tokio::test]
async fn a_disk_tier_without_its_volume_kind_is_refused_in_the_status() {
    let mut md = with_disk_tier(smollm2(), None);
    md.metadata.name = Some("llama".into());
    let (ctx, v) = context();
    let status = refused_status(md, ctx, v).await;
    assert_eq!(condition(&status, "Planned"), ("False", "InvalidSpec"));
    let planned = (status["conditions"].as_array().unwrap().iter())
        .find(|c| c["type"] == "Planned")
        .unwrap();
    let message = planned["message"].as_str().unwrap();
    assert!(
        message.contains("exactly one of storageClassName"),
        "{message}"
    );
}
