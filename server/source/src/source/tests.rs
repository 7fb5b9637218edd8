//! The grammar, table by table, and the CRD pattern held to the parser.

use super::*;
use crate::{SPEC_PATTERN, cel_rule, pattern_of_cel_rule};

fn hf(repo: &str, revision: Option<&str>, file: Option<&str>) -> ModelSource {
    ModelSource::HuggingFace {
        repo: repo.into(),
        revision: revision.map(Into::into),
        file: file.map(Into::into),
    }
}

fn pvc(claim: &str, path: &str) -> ModelSource {
    ModelSource::Pvc {
        claim: claim.into(),
        path: path.into(),
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
        ("hf://org/n@refs/x", hf("org/n", Some("refs"), Some("x"))),
        ("https://h/m.gguf", url("https://h/m.gguf")),
        ("https://h/a/m.gguf?dl=1", url("https://h/a/m.gguf?dl=1")),
        (
            "http://127.0.0.1:8080/m.gguf",
            url("http://127.0.0.1:8080/m.gguf"),
        ),
        ("pvc://models/llama/8b", pvc("models", "llama/8b")),
        ("pvc://models/", pvc("models", "")),
        ("pvc://my.claim-1/dir/", pvc("my.claim-1", "dir/")),
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
        ("hf://./name", "org/name"),
        ("hf://org/name@", "empty revision"),
        ("hf://org/name@/m.gguf", "empty revision"),
        ("hf://org/name/", "bad file"),
        ("hf://org/name/../x.gguf", "bad file"),
        ("hf://org/name/a//b.gguf", "bad file"),
        ("hf://org/name/a\\b.gguf", "bad file"),
        ("ftp://x", "unsupported scheme \"ftp\""),
        ("s3://bucket/m.gguf", "unsupported scheme"),
        ("file://relative", "absolute path"),
        ("file://", "absolute path"),
        ("https://", "no host"),
        ("https://h", "file name"),
        ("https://h/dir/", "file name"),
        ("pvc://models", "pvc://claim/[path]"),
        ("pvc://Bad_Claim/x", "lowercase"),
        ("pvc://-c/x", "lowercase"),
        ("pvc://c/../etc", "bad path"),
        ("pvc://c//x", "bad path"),
    ];
    for (input, needle) in cases {
        match parse(input) {
            Err(e) => assert!(e.to_string().contains(needle), "{input}: {e}"),
            Ok(s) => panic!("{input}: expected a parse error, got {s:?}"),
        }
    }
}

#[test]
fn the_spec_takes_the_four_schemes_only() {
    let cases = [
        ("hf://HuggingFaceTB/SmolLM2-135M-Instruct", true),
        ("pvc://models/llama/8b", true),
        ("file:///models/smollm2.gguf", true),
        ("https://example.com/m.gguf", true),
        ("http://example.com/m.gguf", false),
        ("models/m.gguf", false),
        ("/abs/m.gguf", false),
        ("s3://bucket/key", false),
    ];
    for (source, ok) in cases {
        assert_eq!(parse_spec(source).is_ok(), ok, "{source}");
    }
}

/// Every shape and edge of the grammar: the CRD pattern must agree with
/// `parse_spec` on each (ASCII only: RE2's `\s` is ASCII whitespace).
const AGREEMENT: [&str; 62] = [
    "hf://org/name",
    "hf://org/name@v1",
    "hf://org/name@v1/m.gguf",
    "hf://org/n/sub/dir/m.gguf",
    "hf://org/n@refs/pr/1",
    "hf://org/n@refs/pr/1/m.gguf",
    "hf://org/n@refs/pr",
    "hf://org/n@refs/pr/",
    "hf://org/n@refs//x",
    "hf://org/n@refs/../x",
    "hf://org/n@refs/a\\b",
    "hf://org/n@refs/..",
    "hf://org/n@a@b",
    "hf://org/n@",
    "hf://org/n@/x",
    "hf://org/n@x/",
    "hf://org/n/",
    "hf://org/n//m",
    "hf://org/n/./m",
    "hf://org/n/../m",
    "hf://org/n/...",
    "hf://org/n/.hidden",
    "hf://org/n/..x",
    "hf://org/n/a\\b",
    "hf://.org/n",
    "hf://../n",
    "hf://org/.",
    "hf://o@x/n",
    "hf://org",
    "hf://org/",
    "hf:///n",
    "hf://org/na me",
    "pvc://models/",
    "pvc://models/llama/8b",
    "pvc://models/llama/",
    "pvc://models",
    "pvc://models//",
    "pvc://models/a//b",
    "pvc://models/../x",
    "pvc://Models/x",
    "pvc://m-/x",
    "pvc://a.b-c/x",
    "pvc://a/x\\y",
    "file:///m.gguf",
    "file:///",
    "file:////x",
    "file://rel",
    "file://",
    "https://h/m.gguf",
    "https://h/a/b/m.gguf?x=1/y",
    "https://h/a#b/c.gguf",
    "https://h?x/m.gguf",
    "https://h",
    "https://h/",
    "https://h/dir/",
    "https:///m.gguf",
    "https://h/..",
    "https://h/..x",
    "https://h//m.gguf",
    "https://u@h:8443/m.gguf",
    "http://h/m.gguf",
    "s3://b/k",
];

#[test]
fn the_crd_pattern_accepts_exactly_what_parse_spec_accepts() {
    let re = regex::Regex::new(SPEC_PATTERN).unwrap();
    let mut accepted = 0;
    for input in AGREEMENT {
        let parsed = parse_spec(input);
        assert_eq!(re.is_match(input), parsed.is_ok(), "{input}: {parsed:?}");
        accepted += usize::from(parsed.is_ok());
    }
    // The table exercises both sides.
    assert!(
        accepted > 20 && accepted < AGREEMENT.len() - 20,
        "{accepted}"
    );
}

#[test]
fn the_cel_rule_carries_the_pattern_unchanged() {
    let rule = cel_rule();
    assert!(
        rule.contains(r"\\s"),
        "backslashes are escaped for CEL: {rule}"
    );
    assert_eq!(pattern_of_cel_rule(&rule).as_deref(), Some(SPEC_PATTERN));
    assert_eq!(pattern_of_cel_rule("self == 1"), None);
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
        ("pvc://models/llama/8b.gguf", "8b"),
        ("pvc://models/", "models"),
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
