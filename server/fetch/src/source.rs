//! Parsing a model source string: a pure function, no I/O.

use std::path::PathBuf;

use crate::Error;

/// Where a model comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A local file or directory (plain path or `file:///abs/path`).
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
    /// `https://...` (or `http://...`): one file, usually a GGUF.
    Url(String),
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
        }
    }
}

/// Parses a model source string into a [`ModelSource`] (pure: touches nothing).
pub fn parse(source: &str) -> Result<ModelSource, Error> {
    let bad = |reason: &str| Error::Parse {
        input: source.to_string(),
        reason: reason.to_string(),
    };
    if source.trim().is_empty() {
        return Err(bad("empty"));
    }
    if source.chars().any(char::is_whitespace) {
        return Err(bad("contains whitespace"));
    }
    if let Some(rest) = source.strip_prefix("hf://") {
        return parse_hf(rest).map_err(|r| bad(&r));
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
            "unsupported scheme {scheme:?} (use a path, file://, hf:// or https://)"
        )));
    }
    Ok(ModelSource::Local(PathBuf::from(source)))
}

/// Splits `org/name[@revision][/file]`. A revision is one segment, except
/// `refs/pr/N` and `refs/convert/X`, which are three.
fn parse_hf(rest: &str) -> Result<ModelSource, String> {
    const SHAPE: &str = "expected hf://org/name[@revision][/file]";
    let (org, after_org) = rest.split_once('/').ok_or(SHAPE)?;
    let name_end = after_org.find(['@', '/']).unwrap_or(after_org.len());
    let (name, tail) = after_org.split_at(name_end);
    if !is_repo_part(org) || !is_repo_part(name) {
        return Err(format!("{SHAPE}; org and name must be non-empty"));
    }
    let (revision, file) = match tail.strip_prefix('@') {
        Some(body) => {
            let segments = if body.starts_with("refs/") { 3 } else { 1 };
            let (rev, file) = split_segments(body, segments);
            if rev.is_empty() || rev.split('/').any(str::is_empty) {
                return Err("empty revision after '@'".into());
            }
            (Some(rev.to_string()), file)
        }
        None => (None, tail.strip_prefix('/')),
    };
    let file = match file {
        Some(f) => Some(check_repo_file(f)?.to_string()),
        None if tail.is_empty() || revision.is_some() => None,
        None => return Err(SHAPE.into()),
    };
    Ok(ModelSource::HuggingFace {
        repo: format!("{org}/{name}"),
        revision,
        file,
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
    !s.is_empty() && s != "." && s != ".." && !s.contains(['/', '@', '\\'])
}

/// A relative file path inside a repo: no empty, `.` or `..` segments.
pub(crate) fn check_repo_file(f: &str) -> Result<&str, String> {
    let ok = !f.is_empty()
        && !f.contains('\\')
        && f.split('/').all(|s| !s.is_empty() && s != "." && s != "..");
    if ok {
        Ok(f)
    } else {
        Err(format!("bad file path {f:?} in repo"))
    }
}

/// The last path segment of an http(s) URL (query and fragment dropped).
pub(crate) fn url_file_name(url: &str) -> Result<&str, String> {
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
mod tests {
    use super::*;

    fn hf(repo: &str, revision: Option<&str>, file: Option<&str>) -> ModelSource {
        ModelSource::HuggingFace {
            repo: repo.into(),
            revision: revision.map(Into::into),
            file: file.map(Into::into),
        }
    }

    #[test]
    fn accepted_sources() {
        let local = |p: &str| ModelSource::Local(PathBuf::from(p));
        let url = |u: &str| ModelSource::Url(u.into());
        let cases = [
            ("models/m.gguf", local("models/m.gguf")),
            ("/abs/dir", local("/abs/dir")),
            ("file:///abs/m.gguf", local("/abs/m.gguf")),
            ("hf://org/name", hf("org/name", None, None)),
            ("hf://org/name@v1", hf("org/name", Some("v1"), None)),
            (
                "hf://org/n@abc123/m.gguf",
                hf("org/n", Some("abc123"), Some("m.gguf")),
            ),
            ("hf://org/n/m.gguf", hf("org/n", None, Some("m.gguf"))),
            (
                "hf://org/n/sub/m.gguf",
                hf("org/n", None, Some("sub/m.gguf")),
            ),
            ("hf://org/n@refs/pr/1", hf("org/n", Some("refs/pr/1"), None)),
            (
                "hf://org/n@refs/pr/1/m.gguf",
                hf("org/n", Some("refs/pr/1"), Some("m.gguf")),
            ),
            ("https://h/m.gguf", url("https://h/m.gguf")),
            ("https://h/a/m.gguf?dl=1", url("https://h/a/m.gguf?dl=1")),
            (
                "http://127.0.0.1:8080/m.gguf",
                url("http://127.0.0.1:8080/m.gguf"),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(parse(input).ok(), Some(want), "{input}");
        }
    }

    #[test]
    fn rejected_sources() {
        let cases = [
            ("", "empty"),
            ("   ", "empty"),
            ("a b", "whitespace"),
            ("hf://", "org/name"),
            ("hf://org", "org/name"),
            ("hf://org/", "org/name"),
            ("hf:///name", "org/name"),
            ("hf://org/name@", "empty revision"),
            ("hf://org/name@/m.gguf", "empty revision"),
            ("hf://org/name/", "bad file"),
            ("hf://org/name/../x.gguf", "bad file"),
            ("hf://org/name/a//b.gguf", "bad file"),
            ("ftp://x", "unsupported scheme \"ftp\""),
            ("s3://bucket/m.gguf", "unsupported scheme"),
            ("file://relative", "absolute path"),
            ("file://", "absolute path"),
            ("https://", "no host"),
            ("https://h", "file name"),
            ("https://h/dir/", "file name"),
        ];
        for (input, needle) in cases {
            match parse(input) {
                Err(e @ Error::Parse { .. }) => {
                    assert!(e.to_string().contains(needle), "{input}: {e}")
                }
                other => panic!("{input}: expected a parse error, got {other:?}"),
            }
        }
    }

    #[test]
    fn default_names() {
        let cases = [
            ("/m/smollm2.gguf", "smollm2"),
            ("/m/SmolLM2-135M", "SmolLM2-135M"),
            ("/m/dir/", "dir"),
            ("hf://org/SmolLM2-135M@v1", "SmolLM2-135M"),
            ("hf://org/n/sub/q4.gguf", "q4"),
            ("https://h/a/m-q8.gguf?x=1", "m-q8"),
            ("/m/.hidden", ".hidden"),
        ];
        for (input, want) in cases {
            let name = parse(input).map(|s| s.default_name());
            assert_eq!(name.ok().as_deref(), Some(want), "{input}");
        }
    }

    #[test]
    fn url_file_names() {
        assert_eq!(url_file_name("https://h/a/b.gguf"), Ok("b.gguf"));
        assert_eq!(url_file_name("https://h/b.gguf#x"), Ok("b.gguf"));
    }
}
