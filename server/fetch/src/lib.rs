//! Turns a model source into a local path.
//!
//! Accepted sources (the grammar lives in `ferrox-source`, which the
//! operator's CRD shares):
//! - a local path, or `file:///abs/path`;
//! - `hf://org/name[@revision][/file]`: a Hugging Face Hub repo, downloaded
//!   with `hf-hub` into `<cache>/hub` (the standard HF cache layout);
//! - `https://host/.../file.gguf`: one file, into `<cache>/urls/<sha256>/`.
//!
//! `pvc://` sources are the operator's: it mounts the claim and passes the
//! server the mounted path.
//!
//! [`parse`] is pure; [`resolve`] does the I/O (blocking; it runs once at
//! start-up) and reuses the cache without touching the network.

mod error;
mod hub;
mod progress;
mod url;

use std::path::PathBuf;

pub use error::Error;
pub use ferrox_source::ModelSource;
pub use url::url_cache_path;

/// Where and how to download; filled from flags/env by the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchConfig {
    /// Cache root (`$HF_HOME` layout: hub files go under `<cache_dir>/hub`).
    pub cache_dir: PathBuf,
    /// Hugging Face token (`HF_TOKEN`), sent as `Authorization: Bearer`.
    pub hf_token: Option<String>,
    /// Hub endpoint (`HF_ENDPOINT`); `None` means `https://huggingface.co`.
    pub hf_endpoint: Option<String>,
}

/// The default cache root: `$HF_HOME` if given, else `$HOME/.cache/huggingface`.
///
/// Pure: the caller passes the two environment values in.
pub fn default_cache_dir(hf_home: Option<&str>, home: Option<&str>) -> Option<PathBuf> {
    match (hf_home, home) {
        (Some(h), _) if !h.is_empty() => Some(PathBuf::from(h)),
        (_, Some(home)) if !home.is_empty() => {
            Some(PathBuf::from(home).join(".cache").join("huggingface"))
        }
        _ => None,
    }
}

/// Parses a model source string (pure: touches nothing).
pub fn parse(source: &str) -> Result<ModelSource, Error> {
    Ok(ferrox_source::parse(source)?)
}

/// Resolves `source` to a local file or directory, downloading if needed.
pub fn resolve(source: &ModelSource, config: &FetchConfig) -> Result<PathBuf, Error> {
    match source {
        ModelSource::Local(path) => {
            if path.exists() {
                Ok(path.clone())
            } else {
                Err(Error::LocalMissing(path.clone()))
            }
        }
        ModelSource::HuggingFace {
            repo,
            revision,
            file,
        } => block_on(|| async {
            let hub = hub::HubRepo::new(repo, revision.as_deref(), config)?;
            match file {
                Some(file) => hub.file(file).await,
                None => hub.directory().await,
            }
        }),
        ModelSource::Url(url) => block_on(|| url::fetch_url(url, config)),
        ModelSource::Pvc { claim, .. } => Err(Error::Parse {
            input: format!("pvc://{claim}/..."),
            reason: "a claim is mounted by the operator; pass the server the mounted path".into(),
        }),
    }
}

/// Resolves a LoRA adapter's `source` as [`resolve`] does a model's, but
/// a Hub repo without a file is a PEFT adapter (`adapter_config.json` and
/// `adapter_model.safetensors`), not a model directory.
pub fn resolve_adapter(source: &ModelSource, config: &FetchConfig) -> Result<PathBuf, Error> {
    match source {
        ModelSource::HuggingFace {
            repo,
            revision,
            file: None,
        } => block_on(|| async {
            let hub = hub::HubRepo::new(repo, revision.as_deref(), config)?;
            hub.adapter_directory().await
        }),
        other => resolve(other, config),
    }
}

/// Runs the future `make` builds on a small current-thread runtime; on a
/// thread of its own when called from inside a runtime (which cannot nest).
fn block_on<T, F>(make: impl FnOnce() -> F + Send) -> Result<T, Error>
where
    T: Send,
    F: Future<Output = Result<T, Error>>,
{
    let run = move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::io("<tokio runtime>", e))?
            .block_on(make())
    };
    if tokio::runtime::Handle::try_current().is_err() {
        return run();
    }
    std::thread::scope(|s| match s.spawn(run).join() {
        Ok(result) => result,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_cache_dir_prefers_hf_home() {
        let cases = [
            (Some("/hf"), Some("/home/u"), Some("/hf")),
            (None, Some("/home/u"), Some("/home/u/.cache/huggingface")),
            (
                Some(""),
                Some("/home/u"),
                Some("/home/u/.cache/huggingface"),
            ),
            (None, None, None),
        ];
        for (hf_home, home, want) in cases {
            assert_eq!(
                default_cache_dir(hf_home, home),
                want.map(PathBuf::from),
                "{hf_home:?} {home:?}"
            );
        }
    }

    #[test]
    fn local_paths_must_exist() {
        let config = FetchConfig {
            cache_dir: PathBuf::from("/nonexistent-cache"),
            hf_token: None,
            hf_endpoint: None,
        };
        let dir = tempfile::tempdir().unwrap();
        let here = ModelSource::Local(dir.path().to_path_buf());
        assert_eq!(resolve(&here, &config).unwrap(), dir.path());
        let missing = dir.path().join("nope.gguf");
        let err = resolve(&ModelSource::Local(missing.clone()), &config).unwrap_err();
        assert!(err.to_string().contains(missing.to_str().unwrap()), "{err}");
        let file_uri = parse(&format!("file://{}", missing.display())).unwrap();
        assert!(matches!(
            resolve(&file_uri, &config),
            Err(Error::LocalMissing(_))
        ));
    }
}
