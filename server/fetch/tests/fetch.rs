//! End to end: `parse` + `resolve` against a local hub/HTTP server.

mod common;

use std::path::Path;

use common::Server;
use ferrox_fetch::{Error, FetchConfig, ModelSource, parse, resolve, url_cache_path};

fn config(server: &Server, cache: &Path, token: Option<&str>) -> FetchConfig {
    FetchConfig {
        cache_dir: cache.to_path_buf(),
        hf_token: token.map(Into::into),
        hf_endpoint: Some(server.base.clone()),
    }
}

fn fetch(source: &str, config: &FetchConfig) -> Result<std::path::PathBuf, Error> {
    resolve(&parse(source)?, config)
}

/// A sharded checkpoint: config, tokenizer, tokenizer config, index, 2 shards.
fn add_sharded_model(server: &Server, repo: &str) -> Vec<(&'static str, Vec<u8>)> {
    let index = br#"{"metadata":{"total_size":6},"weight_map":{
        "a.weight":"model-00001-of-00002.safetensors",
        "b.weight":"model-00002-of-00002.safetensors",
        "c.weight":"model-00001-of-00002.safetensors"}}"#;
    let files = vec![
        ("config.json", br#"{"model_type":"llama"}"#.to_vec()),
        ("tokenizer.json", b"{\"tok\":1}".to_vec()),
        (
            "tokenizer_config.json",
            b"{\"chat_template\":\"x\"}".to_vec(),
        ),
        ("model.safetensors.index.json", index.to_vec()),
        ("model-00001-of-00002.safetensors", vec![1u8, 2, 3, 0, 255]),
        ("model-00002-of-00002.safetensors", (0..=255u8).collect()),
    ];
    for (name, bytes) in &files {
        server.add_repo_file(repo, "main", name, bytes);
    }
    files
}

#[test]
fn hf_single_file_is_downloaded_with_its_bytes() {
    let server = Server::start();
    let gguf: Vec<u8> = b"GGUF\x03\x00\x00\x00"
        .iter()
        .copied()
        .cycle()
        .take(3000)
        .collect();
    server.add_repo_file("org/tiny", "main", "tiny.gguf", &gguf);
    server.add_repo_file("org/tiny", "v2", "sub/tiny-q4.gguf", b"GGUF v2");
    let cache = tempfile::tempdir().unwrap();
    let cfg = config(&server, cache.path(), None);

    let path = fetch("hf://org/tiny/tiny.gguf", &cfg).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), gguf);
    assert!(path.starts_with(cache.path().join("hub/models--org--tiny/snapshots")));

    let path = fetch("hf://org/tiny@v2/sub/tiny-q4.gguf", &cfg).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"GGUF v2");
}

#[test]
fn hf_directory_gets_config_tokenizer_and_shards_then_reuses_cache() {
    let server = Server::start();
    let files = add_sharded_model(&server, "org/sharded");
    let cache = tempfile::tempdir().unwrap();
    let cfg = config(&server, cache.path(), None);

    let dir = fetch("hf://org/sharded", &cfg).unwrap();
    assert!(dir.is_dir());
    for (name, bytes) in &files {
        assert_eq!(&std::fs::read(dir.join(name)).unwrap(), bytes, "{name}");
    }
    assert!(!dir.join("generation_config.json").exists());

    let before = server.requests();
    assert_eq!(fetch("hf://org/sharded", &cfg).unwrap(), dir);
    assert_eq!(server.requests(), before, "second resolve used the network");
    server.stop();
    assert_eq!(fetch("hf://org/sharded@main", &cfg).unwrap(), dir);
}

#[test]
fn hf_directory_with_single_safetensors() {
    let server = Server::start();
    let repo = "org/single";
    server.add_repo_file(repo, "main", "config.json", b"{}");
    server.add_repo_file(repo, "main", "tokenizer.json", b"{\"t\":2}");
    server.add_repo_file(repo, "main", "generation_config.json", b"{\"g\":1}");
    server.add_repo_file(repo, "main", "model.safetensors", b"weights");
    let cache = tempfile::tempdir().unwrap();
    let dir = fetch("hf://org/single", &config(&server, cache.path(), None)).unwrap();
    assert_eq!(
        std::fs::read(dir.join("model.safetensors")).unwrap(),
        b"weights"
    );
    assert_eq!(
        std::fs::read(dir.join("generation_config.json")).unwrap(),
        b"{\"g\":1}"
    );
    assert!(!dir.join("tokenizer_config.json").exists());
}

#[test]
fn hf_missing_repo_or_file_is_a_clear_404() {
    let server = Server::start();
    server.add_repo_file("org/tiny", "main", "tiny.gguf", b"GGUF");
    let cache = tempfile::tempdir().unwrap();
    let cfg = config(&server, cache.path(), None);

    let err = fetch("hf://org/missing", &cfg).unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("hf://org/missing@main file config.json"),
        "{msg}"
    );
    assert!(msg.contains("not found"), "{msg}");

    let err = fetch("hf://org/tiny/nope.gguf", &cfg).unwrap_err();
    assert!(
        err.to_string()
            .contains("hf://org/tiny@main file nope.gguf"),
        "{err}"
    );

    // A directory without weights names the missing weights file.
    server.add_repo_file("org/noweights", "main", "config.json", b"{}");
    server.add_repo_file("org/noweights", "main", "tokenizer.json", b"{}");
    let err = fetch("hf://org/noweights", &cfg).unwrap_err();
    assert!(err.to_string().contains("model.safetensors"), "{err}");
}

#[test]
fn hf_private_repo_needs_the_right_token() {
    let server = Server::start();
    server.add_repo_file("org/private", "main", "p.gguf", b"GGUF private");
    server.protect("org/private", "secret");
    let cache = tempfile::tempdir().unwrap();

    let err = fetch(
        "hf://org/private/p.gguf",
        &config(&server, cache.path(), None),
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::Unauthorized { status: 401, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("set HF_TOKEN"), "{err}");

    let empty = config(&server, cache.path(), Some(" "));
    let err = fetch("hf://org/private/p.gguf", &empty).unwrap_err();
    assert!(
        err.to_string().contains("set HF_TOKEN"),
        "empty is no token: {err}"
    );

    let wrong = config(&server, cache.path(), Some("nope"));
    let err = fetch("hf://org/private/p.gguf", &wrong).unwrap_err();
    assert!(err.to_string().contains("HF_TOKEN given is wrong"), "{err}");

    let right = config(&server, cache.path(), Some("secret"));
    let path = fetch("hf://org/private/p.gguf", &right).unwrap();
    assert_eq!(std::fs::read(path).unwrap(), b"GGUF private");
}

#[test]
fn url_download_is_cached_and_reused() {
    let server = Server::start();
    let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    server.add_path("/files/m.gguf", &body);
    let cache = tempfile::tempdir().unwrap();
    let cfg = config(&server, cache.path(), None);
    let url = format!("{}/files/m.gguf", server.base);

    let path = fetch(&url, &cfg).unwrap();
    assert_eq!(path, url_cache_path(cache.path(), &url).unwrap());
    assert_eq!(std::fs::read(&path).unwrap(), body);

    let before = server.requests();
    server.stop();
    assert_eq!(fetch(&url, &cfg).unwrap(), path);
    assert_eq!(server.requests(), before);
}

#[test]
fn resolve_works_from_inside_a_tokio_runtime() {
    let server = Server::start();
    server.add_path("/files/m.gguf", b"GGUF rt");
    server.add_repo_file("org/rt", "main", "m.gguf", b"GGUF hub rt");
    let cache = tempfile::tempdir().unwrap();
    let cfg = config(&server, cache.path(), Some(""));
    let url = format!("{}/files/m.gguf", server.base);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (a, b) = rt.block_on(async { (fetch(&url, &cfg), fetch("hf://org/rt/m.gguf", &cfg)) });
    assert_eq!(std::fs::read(a.unwrap()).unwrap(), b"GGUF rt");
    assert_eq!(std::fs::read(b.unwrap()).unwrap(), b"GGUF hub rt");
}

#[test]
fn url_404_leaves_no_partial_file() {
    let server = Server::start();
    let cache = tempfile::tempdir().unwrap();
    let cfg = config(&server, cache.path(), None);
    let url = format!("{}/files/absent.gguf", server.base);

    let err = fetch(&url, &cfg).unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
    assert!(err.to_string().contains("absent.gguf"), "{err}");
    let dir = url_cache_path(cache.path(), &url).unwrap();
    let dir = dir.parent().unwrap();
    let left = std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0);
    assert_eq!(left, 0, "files left behind in {}", dir.display());
}

#[test]
fn url_broken_transfer_leaves_no_partial_file() {
    let server = Server::start();
    server.add_truncated("/files/cut.gguf", &[7u8; 5000]);
    let cache = tempfile::tempdir().unwrap();
    let cfg = config(&server, cache.path(), None);
    let url = format!("{}/files/cut.gguf", server.base);

    let err = fetch(&url, &cfg).unwrap_err();
    assert!(matches!(err, Error::Network { .. }), "{err:?}");
    assert!(err.to_string().contains("cut.gguf"), "{err}");
    let dest = url_cache_path(cache.path(), &url).unwrap();
    assert!(!dest.exists());
    let left = std::fs::read_dir(dest.parent().unwrap()).unwrap().count();
    assert_eq!(left, 0, "temp file left behind");
}

#[test]
fn unwritable_cache_names_the_path() {
    let server = Server::start();
    server.add_path("/files/m.gguf", b"GGUF");
    let tmp = tempfile::tempdir().unwrap();
    let not_a_dir = tmp.path().join("cache-file");
    std::fs::write(&not_a_dir, b"").unwrap();
    let cfg = config(&server, &not_a_dir, None);
    let err = fetch(&format!("{}/files/m.gguf", server.base), &cfg).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("cache-file"), "{err}");
}

#[test]
fn local_sources_resolve_to_themselves() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("m.gguf");
    std::fs::write(&file, b"GGUF").unwrap();
    let cfg = FetchConfig {
        cache_dir: tmp.path().join("cache"),
        hf_token: None,
        hf_endpoint: None,
    };
    let uri = format!("file://{}", file.display());
    assert_eq!(parse(&uri).unwrap(), ModelSource::Local(file.clone()));
    assert_eq!(fetch(&uri, &cfg).unwrap(), file);
    assert_eq!(fetch(file.to_str().unwrap(), &cfg).unwrap(), file);
    let err = fetch("/definitely/not/here.gguf", &cfg).unwrap_err();
    assert!(
        err.to_string().contains("/definitely/not/here.gguf"),
        "{err}"
    );
}
