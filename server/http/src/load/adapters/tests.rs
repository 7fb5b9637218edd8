use std::path::Path;

use super::*;

/// One layer, every projection 8 x 8.
fn shapes() -> LoraShapes {
    LoraShapes {
        layers: 1,
        dims: [(8, 8); 7],
        gguf_unpermute: None,
        peft_unpermute: None,
        expert_layers: Vec::new(),
        refused: None,
    }
}

/// Writes a PEFT adapter of `rank` over q_proj: the safetensors format
/// by hand (an 8-byte header length, the JSON header, the f32 data).
pub fn write_adapter(dir: &Path, rank: usize) {
    std::fs::create_dir_all(dir).unwrap();
    let config = serde_json::json!({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
        "target_modules": ["q_proj"]});
    std::fs::write(dir.join("adapter_config.json"), config.to_string()).unwrap();
    let p = "base_model.model.model.layers.0.self_attn.q_proj";
    let n = rank * 8 * 4;
    let header = serde_json::json!({
        format!("{p}.lora_A.weight"): {"dtype": "F32", "shape": [rank, 8], "data_offsets": [0, n]},
        format!("{p}.lora_B.weight"): {"dtype": "F32", "shape": [8, rank], "data_offsets": [n, 2 * n]},
    })
    .to_string();
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend((0..2 * rank * 8).flat_map(|i| (i as f32 * 0.01).to_le_bytes()));
    std::fs::write(dir.join("adapter_model.safetensors"), bytes).unwrap();
}

fn store(dir: &Path, max_cpu_loras: usize) -> AdapterStore {
    let config = LoraConfig {
        modules: Vec::new(),
        max_loras: 1,
        max_lora_rank: 8,
        max_cpu_loras,
        allow_runtime_updates: true,
    };
    let root = dir.to_path_buf();
    let resolve: Resolver = Arc::new(move |s: &str| {
        let p = root.join(s);
        p.exists()
            .then_some(p)
            .ok_or_else(|| format!("{s} does not exist"))
    });
    AdapterStore::new("base", shapes(), config, resolve)
}

#[test]
fn eviction_takes_the_least_recently_used_that_no_request_holds() {
    // (loaded: name, last use, held), capacity, expected
    type Case<'a> = (
        &'a [(&'a str, u64, bool)],
        usize,
        Result<Option<&'a str>, ()>,
    );
    let cases: [Case; 5] = [
        (&[("a", 1, false)], 2, Ok(None)),
        (&[("a", 1, false), ("b", 2, false)], 2, Ok(Some("a"))),
        (&[("a", 1, true), ("b", 2, false)], 2, Ok(Some("b"))),
        (&[("a", 1, true), ("b", 2, true)], 2, Err(())),
        (
            &[("a", 5, false), ("b", 2, false), ("c", 9, false)],
            2,
            Ok(Some("b")),
        ),
    ];
    for (loaded, cap, want) in cases {
        assert_eq!(
            to_evict(loaded, cap),
            want.map(|o| o.map(String::from)),
            "{loaded:?}"
        );
    }
}

#[test]
fn adapters_load_list_evict_reload_and_unload() {
    let dir = tempfile::tempdir().unwrap();
    for (name, rank) in [("a", 4), ("b", 2), ("big", 16)] {
        write_adapter(&dir.path().join(name), rank);
    }
    let s = store(dir.path(), 1);
    s.add("one", "a").unwrap();
    s.add("two", "b").unwrap();
    assert_eq!(s.loaded(), 1, "--max-cpu-loras 1: 'one' was unloaded");
    let names: Vec<String> = s.list().into_iter().map(|i| i.name).collect();
    assert_eq!(names, ["one", "two"]);
    // 'one' is read again on demand; held by a request, it stays.
    let held = s.get("one").unwrap().unwrap();
    assert_eq!((held.name(), s.loaded()), ("one", 1));
    assert!(held.key().starts_with("one@"));
    // Both slots held: a third name cannot be read in.
    let err = s.get("two").unwrap().unwrap_err().to_string();
    assert!(err.contains("all 1 LoRA adapters held in memory"), "{err}");
    drop(held);
    assert!(s.get("two").unwrap().is_ok());
    assert!(s.get("nope").is_none());
    s.remove("two").unwrap();
    assert!(matches!(s.remove("two"), Err(ApiError::UnknownAdapter(_))));
    assert!(s.get("two").is_none());
}

#[test]
fn bad_names_and_adapters_are_refused_and_the_store_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    write_adapter(&dir.path().join("a"), 4);
    write_adapter(&dir.path().join("big"), 16);
    let s = store(dir.path(), 4);
    s.add("ok", "a").unwrap();
    for (name, source, why) in [
        ("ok", "a", "has already been loaded"),
        ("base", "a", "is the base model's name"),
        ("", "a", "1 to 256 bytes"),
        ("a b", "a", "no spaces"),
        ("x", "missing", "missing does not exist"),
        ("x", "big", "rank 16 is above --max-lora-rank 8"),
    ] {
        let err = s.add(name, source).unwrap_err();
        assert!(err.to_string().contains(why), "{name}: {err}");
        assert!(matches!(err, ApiError::Invalid { .. }), "{name}: 400");
    }
    assert!(s.get("ok").unwrap().is_ok());
    assert_eq!(s.list().len(), 1);
}
