//! `ferrox-operator render`: the plan and the objects a ModelDeployment would
//! get, as YAML, without a cluster.

use kube::ResourceExt;
use serde::Serialize;

use crate::crd::{ModelDeployment, ObservedGeometry};
use crate::desired::{Desired, DesiredConfig, adapters, desired, kv_offload};
use crate::plan::Planned;
use crate::{Error, geometry, plan};

/// Stands in for the uid the API server would assign (owner references need one).
pub const PLACEHOLDER_UID: &str = "00000000-0000-0000-0000-000000000000";

/// What render produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// The plan.
    pub plan: Planned,
    /// The objects.
    pub desired: Desired,
}

/// Reads a ModelDeployment manifest and fills what the API server would.
pub fn read_manifest(yaml: &str) -> Result<ModelDeployment, Error> {
    let mut md: ModelDeployment = serde_yaml::from_str(yaml)?;
    if md.metadata.name.is_none() {
        return Err(Error::Missing("metadata.name in the manifest"));
    }
    md.metadata
        .namespace
        .get_or_insert_with(|| "default".into());
    md.metadata
        .uid
        .get_or_insert_with(|| PLACEHOLDER_UID.into());
    Ok(md)
}

/// Plans and renders `md`; geometry from `geometry_json` (inspect output) or the spec.
pub fn render(
    md: &ModelDeployment,
    geometry_json: Option<&str>,
    config: &DesiredConfig,
) -> Result<Rendered, Error> {
    let refused = (plan::unsupported(&md.spec))
        .or_else(|| adapters::refusal(md))
        .or_else(|| kv_offload::refusal(&md.spec));
    if let Some((reason, message)) = refused {
        return Err(Error::InvalidSpec(format!("{reason}: {message}")));
    }
    let observed: ObservedGeometry = match (geometry_json, geometry::known(md)) {
        (Some(json), _) => geometry::from_inspection(md, json)?,
        (None, Some(g)) => g,
        (None, None) => {
            return Err(Error::InvalidSpec(
                "no geometry: set spec.model.geometry (and speculative.draftGeometry with a \
                 draft model) or pass --geometry-from INSPECT_JSON (the model's line, then the \
                 draft's)"
                    .into(),
            ));
        }
    };
    let plan = plan::plan_observed(&md.spec, &observed)?;
    let desired = desired(md, &plan, config)?;
    Ok(Rendered { plan, desired })
}

fn doc<T: Serialize>(out: &mut String, obj: &T) -> Result<(), Error> {
    out.push_str("---\n");
    out.push_str(&serde_yaml::to_string(obj)?);
    Ok(())
}

/// The YAML stream: the plan as a comment block, then one document per object.
pub fn to_yaml(md: &ModelDeployment, r: &Rendered) -> Result<String, Error> {
    let mut out = format!(
        "# ferrox-operator render of {}/{}\n",
        md.namespace().unwrap_or_default(),
        md.name_any()
    );
    for line in serde_yaml::to_string(&plan::to_status(&r.plan))?.lines() {
        out.push_str(&format!("# plan.{line}\n"));
    }
    let d = &r.desired;
    doc(&mut out, &d.deployment)?;
    doc(&mut out, &d.service)?;
    if let Some(p) = &d.pdb {
        doc(&mut out, p)?;
    }
    if let Some(h) = &d.hpa {
        doc(&mut out, h)?;
    }
    if let Some(s) = &d.scaled_object {
        doc(&mut out, s)?;
    }
    if let Some(p) = &d.inference_pool {
        doc(&mut out, p)?;
    }
    if let Some(c) = &d.kv_cache_claim {
        doc(&mut out, c)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &str = "
apiVersion: ferrox.dev/v1alpha1
kind: ModelDeployment
metadata:
  name: smol
spec:
  model:
    source: file:///models/SmolLM2-135M-Instruct.Q4_1.gguf
    servedName: smollm2
  resources:
    limits:
      memory: 2Gi
  # Above what memory holds (the activation reserve counts a decode row
  # for each), so the plan shows the reserve the inspection's shape sizes.
  engine:
    maxSeqs: 256
  replicas: 2
";
    const INSPECT: &str = r#"{"architecture":"llama","layers":30,"kvHeads":3,"headDim":64,"kvDtype":"f32","weightBytes":98362432,"contextLength":8192,"hiddenSize":576,"heads":9,"vocabSize":49152}"#;

    #[test]
    fn renders_plan_and_objects_from_inspect_json() {
        let md = read_manifest(MANIFEST).unwrap();
        let r = render(&md, Some(INSPECT), &DesiredConfig::default()).unwrap();
        // The inspection's shape sizes the activation reserve: 17, not 18.
        assert_eq!(r.plan.plan.max_seqs, 17);
        let yaml = to_yaml(&md, &r).unwrap();
        let kinds: Vec<_> = serde_yaml::Deserializer::from_str(&yaml)
            .map(|d| {
                serde_yaml::Value::deserialize(d).unwrap()["kind"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(kinds, ["Deployment", "Service", "PodDisruptionBudget"]);
        let full = r.plan.plan.blocks(ferrox_plan::CacheKind::Full);
        assert!(yaml.contains(&format!("# plan.kvBlocks: {full}")));
        use serde::Deserialize;
    }

    #[test]
    fn speculative_renders_the_flag_and_plans_its_logit_rows() {
        let spec = "  speculative:\n    method: ngram\n    numSpeculativeTokens: 5\n    promptLookupMax: 4\n    promptLookupMin: 2\n";
        let on = read_manifest(&format!("{MANIFEST}{spec}")).unwrap();
        let off = read_manifest(MANIFEST).unwrap();
        let config = DesiredConfig::default();
        let (on_r, off_r) = (
            render(&on, Some(INSPECT), &config).unwrap(),
            render(&off, Some(INSPECT), &config).unwrap(),
        );
        let args = |r: &Rendered| {
            let pod = r
                .desired
                .deployment
                .clone()
                .spec
                .unwrap()
                .template
                .spec
                .unwrap();
            pod.containers[0].args.clone().unwrap()
        };
        let flag = format!("--{}", ferrox_plan::contract::flag::SPECULATIVE_CONFIG);
        let on_args = args(&on_r);
        let at = on_args.iter().position(|a| *a == flag).unwrap();
        let read = ferrox_plan::SpeculativeConfig::parse(&on_args[at + 1]).unwrap();
        assert_eq!(Some(read), on.spec.speculative.unwrap().config().ok());
        assert!(!args(&off_r).contains(&flag));
        // Each sequence's drafts are logit rows in the reserve: less KV.
        let (a, b) = (&on_r.plan.plan, &off_r.plan.plan);
        assert!(a.activation_reserve_bytes > b.activation_reserve_bytes);
        // Out of range: refused with the reason, before any plan.
        let bad =
            read_manifest(&format!("{MANIFEST}{}", spec.replace("Min: 2", "Min: 9"))).unwrap();
        let err = render(&bad, Some(INSPECT), &config)
            .unwrap_err()
            .to_string();
        assert!(err.contains("spec.speculative"), "{err}");
    }

    #[test]
    fn a_draft_model_is_planned_from_its_inspection_and_mounted_from_its_claim() {
        let spec = "  speculative:\n    method: draft_model\n    numSpeculativeTokens: 4\n    model: pvc://drafts/small/d.gguf\n";
        let md = read_manifest(&format!("{MANIFEST}{spec}")).unwrap();
        let config = DesiredConfig::default();
        // The model's line alone: the draft's is missing, and named.
        let err = render(&md, Some(INSPECT), &config).unwrap_err().to_string();
        assert!(err.contains("draft"), "{err}");
        // The draft as large as the model: its weights, and a block beside
        // each of the model's, in the model's KV dtype.
        let both = format!("{INSPECT}\n{INSPECT}\n");
        let r = render(&md, Some(&both), &config).unwrap();
        let off = render(&read_manifest(MANIFEST).unwrap(), Some(INSPECT), &config).unwrap();
        let (on, off) = (&r.plan.plan, &off.plan.plan);
        let blocks = on.blocks(ferrox_plan::CacheKind::Full);
        let block = on.pools[0].block_bytes;
        assert_eq!(on.draft_bytes, on.weight_bytes + blocks * block);
        assert!(blocks < off.blocks(ferrox_plan::CacheKind::Full));
        assert!(on.total_bytes() <= r.plan.memory.bytes);
        let status = plan::to_status(&r.plan);
        assert_eq!(status.draft_bytes, Some(on.draft_bytes as i64));
        // The server gets the draft at its claim's mount.
        let pod = r.desired.deployment.spec.unwrap().template.spec.unwrap();
        let args = pod.containers[0].args.clone().unwrap();
        let flag = format!("--{}", ferrox_plan::contract::flag::SPECULATIVE_CONFIG);
        let at = args.iter().position(|a| *a == flag).unwrap();
        let read = ferrox_plan::SpeculativeFlag::parse(&args[at + 1]).unwrap();
        assert_eq!(
            read.draft_model.as_deref(),
            Some("/draft/drafts/small/d.gguf")
        );
        assert_eq!(read.config.num_speculative_tokens, 4);
        let vols = pod.volumes.unwrap();
        assert!(vols.iter().any(|v| v.name == "draft-drafts"), "{vols:?}");
        // A draft that downloads brings the download cache.
        let hf = spec.replace("pvc://drafts/small/d.gguf", "hf://org/draft");
        let md = read_manifest(&format!("{MANIFEST}{hf}")).unwrap();
        let r = render(&md, Some(&both), &config).unwrap();
        let pod = r.desired.deployment.spec.unwrap().template.spec.unwrap();
        let c = &pod.containers[0];
        let args = c.args.clone().unwrap();
        assert!(
            args.iter().any(|a| a.contains("\"hf://org/draft\"")),
            "{args:?}"
        );
        assert!(pod.volumes.unwrap().iter().any(|v| v.name == "model-cache"));
        assert!(c.env.clone().unwrap().iter().any(|e| e.name == "HF_HOME"));
    }

    #[test]
    fn a_shared_disk_tier_renders_its_claim_and_a_cpu_host_tier_is_refused() {
        let disk = "  kvCache:\n    offload:\n      disk:\n        size: 8Gi\n        storageClassName: local\n";
        let md = read_manifest(&format!("{MANIFEST}{disk}")).unwrap();
        let r = render(&md, Some(INSPECT), &DesiredConfig::default()).unwrap();
        let yaml = to_yaml(&md, &r).unwrap();
        assert!(yaml.contains("kind: PersistentVolumeClaim"), "{yaml}");
        // Two replicas and a rollout's surge pod share the claim: 8Gi / 3
        // each, less 1/32.
        let share = (8u64 << 30) / 3;
        assert!(yaml.contains(&format!("disk=/var/cache/ferrox/kv:{}", share - share / 32)));
        let host = "  kvCache:\n    offload:\n      hostMemory: 1Gi\n";
        let cpu = read_manifest(&format!("{MANIFEST}{host}")).unwrap();
        let err = render(&cpu, Some(INSPECT), &DesiredConfig::default()).unwrap_err();
        assert!(
            err.to_string()
                .contains("on a CPU server the KV pool is host memory already"),
            "{err}"
        );
    }

    #[test]
    fn refuses_without_geometry_or_memory() {
        let md = read_manifest(MANIFEST).unwrap();
        let err = render(&md, None, &DesiredConfig::default()).unwrap_err();
        assert!(err.to_string().contains("--geometry-from"));
        let tiny = read_manifest(&MANIFEST.replace("2Gi", "256Mi")).unwrap();
        let err = render(&tiny, Some(INSPECT), &DesiredConfig::default()).unwrap_err();
        assert!(err.to_string().contains("insufficient memory"), "{err}");
    }

    /// Where the examples' pod args are committed for the server's CLI test
    /// (`server/http/src/cli_tests.rs` parses them and checks the plan).
    const POD_ARGS: &str = "../tests/contract/examples-pod-args.json";

    /// Each example's plan and the args its pods get, keyed by file name.
    fn examples_pod_args() -> serde_json::Value {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".yaml"))
            .collect();
        names.sort();
        let mut out = serde_json::Map::new();
        for name in names {
            let md = read_manifest(&std::fs::read_to_string(dir.join(&name)).unwrap()).unwrap();
            let r = render(&md, None, &DesiredConfig::default()).unwrap();
            let pod = r.desired.deployment.spec.unwrap().template.spec.unwrap();
            let p = &r.plan.plan;
            let entry = serde_json::json!({
                "plan": {
                    "pools": p.sizes().iter().map(|&(k, n)| ferrox_plan::contract::pool_arg(k, n)).collect::<Vec<_>>(),
                    "blockSize": p.block_size,
                    "maxSeqs": p.max_seqs,
                    "maxModelLen": p.max_model_len,
                    "device": r.plan.device,
                    "kvDtype": r.plan.kv_dtype,
                    "servedModelName": crate::served_name::served_name(&md),
                    "adapters": md.spec.adapters.iter().map(|a| &a.name).collect::<Vec<_>>(),
                },
                "args": pod.containers[0].args,
            });
            out.insert(name, entry);
        }
        serde_json::Value::Object(out)
    }

    #[test]
    fn the_examples_pod_args_are_the_committed_ones() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(POD_ARGS);
        let now = serde_json::to_string_pretty(&examples_pod_args()).unwrap() + "\n";
        if std::env::var_os("FERROX_BLESS").is_some() {
            std::fs::write(&path, &now).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == now,
            "tests/contract/examples-pod-args.json is stale: run `FERROX_BLESS=1 cargo test -p ferrox-operator examples_pod_args`"
        );
    }
}
