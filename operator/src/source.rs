//! How a pod reaches each model source. The grammar itself is
//! `ferrox-source`'s, shared with the server and the CRD's CEL rule.

pub use ferrox_source::ModelSource;

use crate::Error;

/// Where a PVC source is mounted in the server container.
pub const PVC_MOUNT: &str = "/models";

/// Parses `spec.model.source` (what the CRD's pattern accepts).
pub fn parse(source: &str) -> Result<ModelSource, Error> {
    ferrox_source::parse_spec(source).map_err(|e| Error::InvalidSpec(e.to_string()))
}

/// The `--model` argument the server gets in the pod.
pub fn server_arg(source: &ModelSource, original: &str) -> String {
    match source {
        ModelSource::Pvc { path, .. } => format!("{PVC_MOUNT}/{}", path.trim_start_matches('/'))
            .trim_end_matches('/')
            .to_string(),
        ModelSource::Local(path) => path.to_string_lossy().into_owned(),
        ModelSource::HuggingFace { .. } | ModelSource::Url(_) => original.to_string(),
    }
}

/// Whether the server downloads the model (and so needs a cache volume).
pub fn downloads(source: &ModelSource) -> bool {
    matches!(
        source,
        ModelSource::HuggingFace { .. } | ModelSource::Url(_)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_arg_per_scheme() {
        let cases = [
            ("hf://org/m@v1", "hf://org/m@v1", true),
            (
                "hf://org/m/model.Q4_1.gguf",
                "hf://org/m/model.Q4_1.gguf",
                true,
            ),
            (
                "hf://org/m@v1/sub/model.gguf",
                "hf://org/m@v1/sub/model.gguf",
                true,
            ),
            ("https://h/m.gguf", "https://h/m.gguf", true),
            ("pvc://models/llama/8b", "/models/llama/8b", false),
            ("pvc://models/", "/models", false),
            ("file:///data/m.gguf", "/data/m.gguf", false),
        ];
        for (src, arg, dl) in cases {
            let parsed = parse(src).unwrap();
            assert_eq!(server_arg(&parsed, src), arg, "{src}");
            assert_eq!(downloads(&parsed), dl, "{src}");
        }
    }

    #[test]
    fn the_spec_refuses_what_the_pod_cannot_reach() {
        for src in [
            "models/m.gguf",
            "http://h/m.gguf",
            "pvc://Bad_Claim/x",
            "hf://org/m@",
        ] {
            assert!(matches!(parse(src), Err(Error::InvalidSpec(_))), "{src}");
        }
    }
}
