//! `hf://` sources: downloads through `hf-hub` into the standard HF cache.

use std::path::{Path, PathBuf};

use hf_hub::api::tokio::{Api, ApiBuilder, ApiError, ApiRepo};
use hf_hub::{Cache, Repo, RepoType};

use crate::error::Token;
use crate::progress::Progress;
use crate::{Error, FetchConfig};
use ferrox_source::repo_file as check_repo_file;

/// Files a model directory needs.
const REQUIRED: &[&str] = &["config.json", "tokenizer.json"];
/// Files a model directory uses when the repo has them.
const OPTIONAL: &[&str] = &["tokenizer_config.json", "generation_config.json"];
/// The shard index of a sharded safetensors checkpoint.
const INDEX: &str = "model.safetensors.index.json";
/// A PEFT adapter's files.
const ADAPTER_FILES: [&str; 2] = ["adapter_config.json", "adapter_model.safetensors"];
/// The single-file safetensors checkpoint.
const SINGLE: &str = "model.safetensors";

/// One repo at one revision, with what it needs to download from it.
pub(crate) struct HubRepo {
    api: ApiRepo,
    cache: hf_hub::CacheRepo,
    /// `hf://org/name@rev`, for messages.
    label: String,
    token: Token,
    /// `<cache>/hub`, named in I/O errors.
    hub_dir: PathBuf,
    /// Marks a complete model directory download, for offline reuse.
    marker: PathBuf,
}

impl HubRepo {
    /// Opens `repo` at `revision` (default `main`) with `config`.
    pub(crate) fn new(
        repo: &str,
        revision: Option<&str>,
        config: &FetchConfig,
    ) -> Result<Self, Error> {
        let revision = revision.unwrap_or("main");
        let label = format!("hf://{repo}@{revision}");
        let token = config.hf_token.clone().filter(|t| !t.trim().is_empty());
        let hub_dir = config.cache_dir.join("hub");
        let cache = Cache::new(hub_dir.clone());
        let mut builder = ApiBuilder::from_cache(cache.clone())
            .with_progress(false)
            .with_token(token.clone());
        if let Some(endpoint) = config
            .hf_endpoint
            .as_deref()
            .filter(|e| !e.trim().is_empty())
        {
            builder = builder.with_endpoint(endpoint.trim_end_matches('/').to_string());
        }
        let api: Api = builder.build().map_err(|e| Error::Network {
            what: label.clone(),
            message: format!("cannot build HTTP client: {}", crate::error::chain(&e)),
        })?;
        let hf_repo = Repo::with_revision(repo.to_string(), RepoType::Model, revision.to_string());
        let marker = config
            .cache_dir
            .join("ferrox-complete")
            .join(hf_repo.folder_name())
            .join(revision.replace('/', "%2F"));
        Ok(Self {
            api: api.repo(hf_repo.clone()),
            cache: cache.repo(hf_repo),
            label,
            token: if token.is_some() {
                Token::Sent
            } else {
                Token::NotSent
            },
            hub_dir,
            marker,
        })
    }

    /// One file: from the cache if there, else downloaded.
    pub(crate) async fn file(&self, file: &str) -> Result<PathBuf, Error> {
        if let Some(path) = self.cache.get(file) {
            return Ok(path);
        }
        let what = format!("{} file {file}", self.label);
        let progress = Progress::new(&what);
        self.api
            .download_with_progress(file, progress)
            .await
            .map_err(|e| self.api_error(&what, e))
    }

    /// An optional file: `None` if the repo does not have it (404).
    async fn optional(&self, file: &str) -> Result<Option<PathBuf>, Error> {
        match self.file(file).await {
            Ok(p) => Ok(Some(p)),
            Err(Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The model directory (snapshot) with config, tokenizer and weights.
    pub(crate) async fn directory(&self) -> Result<PathBuf, Error> {
        if let Some(dir) = self.cached_directory() {
            return Ok(dir);
        }
        let mut got = Vec::new();
        for f in REQUIRED {
            self.file(f).await?;
            got.push((*f).to_string());
        }
        for f in OPTIONAL {
            if self.optional(f).await?.is_some() {
                got.push((*f).to_string());
            }
        }
        got.extend(self.weights().await?);
        let config = self.file(REQUIRED[0]).await?;
        let dir = config
            .parent()
            .map(Path::to_path_buf)
            .ok_or_else(|| Error::BadFile {
                path: config.clone(),
                reason: "cached file has no parent directory".into(),
            })?;
        self.write_marker(&got)?;
        Ok(dir)
    }

    /// A PEFT adapter's directory (snapshot): `adapter_config.json` and
    /// `adapter_model.safetensors`.
    pub(crate) async fn adapter_directory(&self) -> Result<PathBuf, Error> {
        let config = self.file(ADAPTER_FILES[0]).await?;
        self.file(ADAPTER_FILES[1]).await?;
        config
            .parent()
            .map(Path::to_path_buf)
            .ok_or_else(|| Error::BadFile {
                path: config.clone(),
                reason: "cached file has no parent directory".into(),
            })
    }

    /// Downloads the safetensors weights; returns their repo file names.
    async fn weights(&self) -> Result<Vec<String>, Error> {
        let Some(index) = self.optional(INDEX).await? else {
            self.file(SINGLE).await?;
            return Ok(vec![SINGLE.to_string()]);
        };
        let text = std::fs::read_to_string(&index).map_err(|e| Error::io(&index, e))?;
        let shards = shard_names(&text).map_err(|reason| Error::BadFile {
            path: index.clone(),
            reason,
        })?;
        for shard in &shards {
            self.file(shard).await?;
        }
        let mut got = vec![INDEX.to_string()];
        got.extend(shards);
        Ok(got)
    }

    /// The snapshot directory, if a previous directory download completed
    /// and every file it fetched is still in the cache.
    fn cached_directory(&self) -> Option<PathBuf> {
        let listed = std::fs::read_to_string(&self.marker).ok()?;
        let mut dir = None;
        for file in listed.lines().filter(|l| !l.is_empty()) {
            let path = self.cache.get(file)?;
            if file == REQUIRED[0] {
                dir = path.parent().map(Path::to_path_buf);
            }
        }
        dir
    }

    fn write_marker(&self, files: &[String]) -> Result<(), Error> {
        if let Some(parent) = self.marker.parent() {
            std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        }
        std::fs::write(&self.marker, files.join("\n")).map_err(|e| Error::io(&self.marker, e))
    }

    fn api_error(&self, what: &str, err: ApiError) -> Error {
        match err {
            ApiError::RequestError(e) => Error::from_reqwest(what, &e, self.token),
            ApiError::TooManyRetries(inner) => self.api_error(what, *inner),
            ApiError::IoError(e) => Error::Io {
                path: self.hub_dir.clone(),
                source: e,
            },
            ApiError::LockAcquisition(path) => Error::Io {
                path,
                source: std::io::Error::other("another process is downloading this file"),
            },
            other => Error::Network {
                what: what.to_string(),
                message: crate::error::chain(&other),
            },
        }
    }
}

/// The distinct shard file names in a `model.safetensors.index.json`, sorted.
pub(crate) fn shard_names(index_json: &str) -> Result<Vec<String>, String> {
    let value: serde_json::Value =
        serde_json::from_str(index_json).map_err(|e| format!("not valid JSON: {e}"))?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or("no \"weight_map\" object")?;
    let mut names = Vec::new();
    for file in map.values() {
        let file = file.as_str().ok_or("weight_map value is not a string")?;
        check_repo_file(file)?;
        names.push(file.to_string());
    }
    names.sort();
    names.dedup();
    if names.is_empty() {
        return Err("empty weight_map".into());
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names_are_distinct_and_sorted() {
        let json = r#"{"metadata":{},"weight_map":{
            "a":"model-00002-of-00002.safetensors",
            "b":"model-00001-of-00002.safetensors",
            "c":"model-00001-of-00002.safetensors"}}"#;
        assert_eq!(
            shard_names(json).unwrap(),
            vec![
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"
            ]
        );
    }

    #[test]
    fn bad_indexes_are_rejected() {
        let cases = [
            ("not json", "not valid JSON"),
            ("{}", "weight_map"),
            (r#"{"weight_map":{}}"#, "empty"),
            (r#"{"weight_map":{"a":1}}"#, "not a string"),
            (r#"{"weight_map":{"a":"../x"}}"#, "bad file path"),
        ];
        for (json, needle) in cases {
            let err = shard_names(json).unwrap_err();
            assert!(err.contains(needle), "{json}: {err}");
        }
    }
}
