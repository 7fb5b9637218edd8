//! Model sources (`spec.model.source`) and how a pod reaches each.

use crate::Error;

/// A parsed `spec.model.source`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// `hf://org/name[@rev]`: the server downloads it into its cache.
    HuggingFace {
        /// `org/name`.
        repo: String,
        /// Revision, if pinned.
        revision: Option<String>,
    },
    /// `pvc://claim/path`: a claim mounted read-only.
    Pvc {
        /// Claim name.
        claim: String,
        /// Path inside the claim.
        path: String,
    },
    /// `file:///path`: already on the node's image or a volume.
    File {
        /// Absolute path.
        path: String,
    },
    /// `https://...`: the server downloads it into its cache.
    Https {
        /// The whole URL.
        url: String,
    },
}

/// Where a PVC source is mounted in the server container.
pub const PVC_MOUNT: &str = "/models";

impl ModelSource {
    /// Parses a source string; the same shapes the CRD's CEL rule accepts.
    pub fn parse(source: &str) -> Result<Self, Error> {
        let bad = || Error::InvalidSpec(format!("unsupported model source {source:?}"));
        if source.contains(' ') {
            return Err(bad());
        }
        if let Some(rest) = source.strip_prefix("hf://") {
            // org/name[@rev][/file.gguf]: the file (if any) is the server's business.
            let mut segs = rest.splitn(3, '/');
            let (org, name_rev) = (segs.next().unwrap_or(""), segs.next().unwrap_or(""));
            if segs.next().is_some_and(str::is_empty) {
                return Err(bad());
            }
            let (name, revision) = match name_rev.split_once('@') {
                Some((n, rev)) if !rev.is_empty() => (n, Some(rev.to_string())),
                Some(_) => return Err(bad()),
                None => (name_rev, None),
            };
            if org.is_empty() || name.is_empty() {
                return Err(bad());
            }
            return Ok(ModelSource::HuggingFace {
                repo: format!("{org}/{name}"),
                revision,
            });
        }
        if let Some(rest) = source.strip_prefix("pvc://") {
            let (claim, path) = rest.split_once('/').ok_or_else(bad)?;
            if !is_dns_label(claim) {
                return Err(bad());
            }
            return Ok(ModelSource::Pvc {
                claim: claim.to_string(),
                path: path.to_string(),
            });
        }
        if let Some(rest) = source.strip_prefix("file://") {
            if rest.len() > 1 && rest.starts_with('/') {
                return Ok(ModelSource::File {
                    path: rest.to_string(),
                });
            }
            return Err(bad());
        }
        if source.starts_with("https://") && source.len() > "https://".len() {
            return Ok(ModelSource::Https {
                url: source.to_string(),
            });
        }
        Err(bad())
    }

    /// The `--model` argument the server gets in the pod.
    pub fn server_arg(&self, original: &str) -> String {
        match self {
            ModelSource::Pvc { path, .. } => {
                format!("{PVC_MOUNT}/{}", path.trim_start_matches('/'))
                    .trim_end_matches('/')
                    .to_string()
            }
            ModelSource::File { path } => path.clone(),
            ModelSource::HuggingFace { .. } | ModelSource::Https { .. } => original.to_string(),
        }
    }

    /// Whether the server downloads the model (and so needs a cache volume).
    pub fn downloads(&self) -> bool {
        matches!(
            self,
            ModelSource::HuggingFace { .. } | ModelSource::Https { .. }
        )
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && !s.starts_with(['-', '.'])
        && !s.ends_with(['-', '.'])
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
        for (src, arg, downloads) in cases {
            let parsed = ModelSource::parse(src).unwrap();
            assert_eq!(parsed.server_arg(src), arg, "{src}");
            assert_eq!(parsed.downloads(), downloads, "{src}");
        }
    }

    #[test]
    fn hf_revision_is_split_off() {
        assert_eq!(
            ModelSource::parse("hf://org/m@main").unwrap(),
            ModelSource::HuggingFace {
                repo: "org/m".into(),
                revision: Some("main".into())
            }
        );
        assert!(ModelSource::parse("hf://org/m@").is_err());
        assert!(ModelSource::parse("pvc://Bad_Claim/x").is_err());
    }
}
