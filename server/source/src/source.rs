//! Parsing a model source string into a [`ModelSource`].

use std::path::PathBuf;

use crate::ParseError;

/// Where a model comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A local file or directory (a plain path or `file:///abs/path`).
    Local(PathBuf),
    /// `hf://org/name[@revision][/file]`: a Hugging Face Hub repo.
    HuggingFace {
        /// `org/name`.
        repo: String,
        /// Branch, tag or commit; `None` means `main`.
        revision: Option<String>,
        /// One file in the repo (e.g. a GGUF); `None` means the model directory.
        file: Option<String>,
    },
    /// `https://...` (or `http://...` on the command line): one file.
    Url(String),
    /// `pvc://claim/path`: a path on a PersistentVolumeClaim, which the
    /// operator mounts; the server itself is given the mounted path.
    Pvc {
        /// The claim's name.
        claim: String,
        /// The path inside the claim, without a leading `/` (may be empty).
        path: String,
    },
}

impl ModelSource {
    /// A default served-model name: the file stem, or the repo's name part.
    pub fn default_name(&self) -> String {
        let stem = |p: &str| {
            let p = p.trim_end_matches('/');
            let last = p.rsplit('/').next().unwrap_or(p);
            let stem = last.rsplit_once('.').map_or(last, |(s, _)| s);
            if stem.is_empty() {
                last.to_string()
            } else {
                stem.to_string()
            }
        };
        match self {
            ModelSource::Local(path) => stem(&path.to_string_lossy()),
            ModelSource::HuggingFace {
                file: Some(file), ..
            } => stem(file),
            ModelSource::HuggingFace { repo, .. } => {
                repo.rsplit('/').next().unwrap_or(repo).to_string()
            }
            ModelSource::Url(url) => url_file_name(url).map_or_else(|_| url.clone(), stem),
            ModelSource::Pvc { claim, path } if path.trim_matches('/').is_empty() => claim.clone(),
            ModelSource::Pvc { path, .. } => stem(path),
        }
    }
}

/// Parses the server's `--model`: every scheme, `http://`, and plain paths.
pub fn parse(source: &str) -> Result<ModelSource, ParseError> {
    let bad = |reason: &str| ParseError {
        input: source.to_string(),
        reason: reason.to_string(),
    };
    if source.trim_ascii().is_empty() {
        return Err(bad("empty"));
    }
    if source.bytes().any(|b| b.is_ascii_whitespace()) {
        return Err(bad("contains whitespace"));
    }
    if let Some(rest) = source.strip_prefix("hf://") {
        return parse_hf(rest).map_err(|r| bad(&r));
    }
    if let Some(rest) = source.strip_prefix("pvc://") {
        return parse_pvc(rest).map_err(|r| bad(&r));
    }
    if let Some(rest) = source.strip_prefix("file://") {
        if rest.len() > 1 && rest.starts_with('/') {
            return Ok(ModelSource::Local(PathBuf::from(rest)));
        }
        return Err(bad("file:// needs an absolute path: file:///abs/path"));
    }
    if source.starts_with("https://") || source.starts_with("http://") {
        url_file_name(source).map_err(|r| bad(&r))?;
        return Ok(ModelSource::Url(source.to_string()));
    }
    if let Some((scheme, _)) = source.split_once("://") {
        return Err(bad(&format!(
            "unsupported scheme {scheme:?} (use a path, file://, hf://, https:// or pvc://)"
        )));
    }
    Ok(ModelSource::Local(PathBuf::from(source)))
}

/// Parses a `ModelDeployment`'s `spec.model.source`: `hf://`, `pvc://`,
/// `file:///` and `https://` only (a pod has no working directory to be
/// relative to, and no model travels in clear text). Accepts exactly what
/// [`SPEC_PATTERN`](crate::SPEC_PATTERN) matches.
pub fn parse_spec(source: &str) -> Result<ModelSource, ParseError> {
    let schemes = ["hf://", "pvc://", "file://", "https://"];
    if !schemes.iter().any(|s| source.starts_with(s)) {
        return Err(ParseError {
            input: source.to_string(),
            reason:
                "must be hf://org/name[@rev][/file], pvc://claim/path, file:///path or https://..."
                    .into(),
        });
    }
    parse(source)
}

/// Splits `org/name[@revision][/file]`. A revision is one segment, except
/// `refs/pr/N` and `refs/convert/X`, which are three.
fn parse_hf(rest: &str) -> Result<ModelSource, String> {
    const SHAPE: &str = "expected hf://org/name[@revision][/file]";
    let (org, after_org) = rest.split_once('/').ok_or(SHAPE)?;
    let name_end = after_org.find(['@', '/']).unwrap_or(after_org.len());
    let (name, tail) = after_org.split_at(name_end);
    if !is_repo_part(org) || !is_repo_part(name) {
        return Err(format!(
            "{SHAPE}; org and name must be non-empty, not . or .., without @ or \\"
        ));
    }
    let (revision, file) = match tail.strip_prefix('@') {
        Some(body) => {
            // `refs/...` with fewer than three segments reads as the
            // revision `refs` and a file, as the CRD's pattern does.
            let refs = body.starts_with("refs/") && body.split('/').count() >= 3;
            let segments = if refs { 3 } else { 1 };
            let (rev, file) = split_segments(body, segments);
            if rev.is_empty() || rev.split('/').any(str::is_empty) {
                return Err("empty revision after '@'".into());
            }
            (Some(rev.to_string()), file)
        }
        None => (None, tail.strip_prefix('/')),
    };
    let file = match file {
        Some(f) => Some(repo_file(f)?.to_string()),
        None if tail.is_empty() || revision.is_some() => None,
        None => return Err(SHAPE.into()),
    };
    Ok(ModelSource::HuggingFace {
        repo: format!("{org}/{name}"),
        revision,
        file,
    })
}

/// Splits `claim/[path]`: the claim is a DNS subdomain, the path relative
/// (no empty, `.` or `..` segment; one trailing `/` allowed).
fn parse_pvc(rest: &str) -> Result<ModelSource, String> {
    const SHAPE: &str = "expected pvc://claim/[path]";
    let (claim, path) = rest.split_once('/').ok_or(SHAPE)?;
    if !is_dns_subdomain(claim) {
        return Err(format!(
            "{SHAPE}; the claim {claim:?} must be lowercase letters, digits, '-' and '.'"
        ));
    }
    let inner = path.strip_suffix('/').unwrap_or(path);
    if !path.is_empty() && !inner.split('/').all(is_path_segment) {
        return Err(format!("bad path {path:?} in the claim"));
    }
    Ok(ModelSource::Pvc {
        claim: claim.to_string(),
        path: path.to_string(),
    })
}

/// Splits `s` after its first `n` '/'-separated segments.
fn split_segments(s: &str, n: usize) -> (&str, Option<&str>) {
    let mut idx = 0;
    for _ in 0..n {
        match s[idx..].find('/') {
            Some(i) => idx += i + 1,
            None => return (s, None),
        }
    }
    (&s[..idx - 1], Some(&s[idx..]))
}

fn is_repo_part(s: &str) -> bool {
    is_path_segment(s) && !s.contains('@')
}

fn is_path_segment(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains(['/', '\\'])
}

fn is_dns_subdomain(s: &str) -> bool {
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    s.starts_with(ok) && s.ends_with(ok) && s.chars().all(|c| ok(c) || c == '-' || c == '.')
}

/// A relative file path inside a repo: no empty, `.` or `..` segments, no `\`.
pub fn repo_file(f: &str) -> Result<&str, String> {
    if f.split('/').all(is_path_segment) {
        Ok(f)
    } else {
        Err(format!("bad file path {f:?} in repo"))
    }
}

/// The last path segment of an http(s) URL (query and fragment dropped).
pub fn url_file_name(url: &str) -> Result<&str, String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    if host.is_empty() {
        return Err("URL has no host".into());
    }
    let name = path.rsplit('/').next().unwrap_or_default();
    if name.is_empty() || name == "." || name == ".." {
        return Err("URL must end in a file name, e.g. https://host/model.gguf".into());
    }
    Ok(name)
}

#[cfg(test)]
mod tests;
