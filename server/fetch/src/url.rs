//! `https://` sources: one file, downloaded to `<cache>/urls/<sha256(url)>/<name>`.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::Token;
use crate::progress::Progress;
use crate::{Error, FetchConfig};
use ferrox_source::url_file_name;

/// Where `url` is cached under `cache_dir` (pure).
pub fn url_cache_path(cache_dir: &Path, url: &str) -> Result<PathBuf, Error> {
    let name = url_file_name(url).map_err(|reason| Error::Parse {
        input: url.to_string(),
        reason,
    })?;
    let digest = Sha256::digest(url.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    Ok(cache_dir.join("urls").join(hex).join(name))
}

/// Downloads `url` unless already cached; returns the cached file.
pub(crate) async fn fetch_url(url: &str, config: &FetchConfig) -> Result<PathBuf, Error> {
    let dest = url_cache_path(&config.cache_dir, url)?;
    if dest.is_file() {
        return Ok(dest);
    }
    let dir = dest.parent().map(Path::to_path_buf).unwrap_or_default();
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let tmp = dir.join(format!(".download-{}.part", std::process::id()));
    let result = download_to(url, &tmp).await;
    let result =
        result.and_then(|()| std::fs::rename(&tmp, &dest).map_err(|e| Error::io(&dest, e)));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map(|()| dest)
}

/// Streams `url` into `path` (created or truncated), logging progress.
async fn download_to(url: &str, path: &Path) -> Result<(), Error> {
    let client = reqwest::Client::builder()
        .build()
        .map_err(|e| Error::from_reqwest(url, &e, Token::Never))?;
    let mut response = client
        .get(url)
        .send()
        .await
        .map_err(|e| Error::from_reqwest(url, &e, Token::Never))?;
    let status = response.status();
    if !status.is_success() {
        return Err(Error::from_status(url, status.as_u16(), Token::Never));
    }
    let total = response.content_length().unwrap_or(0);
    let progress = Progress::new(url);
    progress.start(total);
    let file = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    let mut out = std::io::BufWriter::new(file);
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| Error::from_reqwest(url, &e, Token::Never))?
    {
        out.write_all(&chunk).map_err(|e| Error::io(path, e))?;
        let _ = progress.add(chunk.len() as u64);
    }
    let file = out
        .into_inner()
        .map_err(|e| Error::io(path, e.into_error()))?;
    file.sync_all().map_err(|e| Error::io(path, e))?;
    let written = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if total != 0 && written != total {
        return Err(Error::Network {
            what: url.to_string(),
            message: format!("connection closed after {written} of {total} bytes"),
        });
    }
    progress.finish();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_path_is_sha256_of_url_plus_name() {
        let p = url_cache_path(Path::new("/c"), "https://h/a/m.gguf").unwrap();
        assert_eq!(p.file_name().unwrap(), "m.gguf");
        let hash = p.parent().unwrap().file_name().unwrap().to_str().unwrap();
        assert_eq!(hash.len(), 64);
        assert!(p.starts_with("/c/urls"));
        let q = url_cache_path(Path::new("/c"), "https://h/b/m.gguf").unwrap();
        assert_ne!(p, q, "different URLs, different directories");
    }

    #[test]
    fn sha256_matches_known_vector() {
        let p = url_cache_path(Path::new("/c"), "https://h/").unwrap_err();
        assert!(matches!(p, Error::Parse { .. }));
        let digest = Sha256::digest(b"abc");
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
