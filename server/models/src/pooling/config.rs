//! What a model's files say about pooling: sentence-transformers' modules
//! (`modules.json`, the Pooling module's `config.json`, `Dense` modules, a
//! `Normalize`) and prompts, GGUF's `{arch}.pooling_type` and dense
//! tensors, and the Matryoshka sizes `config.json` names
//! (`matryoshka_dimensions`, `is_matryoshka`). A module whose math is not
//! served (max pooling, an unknown module) is refused with its name rather
//! than skipped: a vector pooled otherwise than trained is plausible and
//! wrong, with no error anywhere.

use std::path::Path;

use serde::Deserialize;

use super::activation::ModuleActivation;
use super::dense::{DenseModule, DenseWeights};
use super::prompts::Prompts;
use super::{Pooling, PoolingMethod};
use crate::config::{HfConfig, Metadata};
use crate::error::{Error, Result};

/// What the model's own files say about pooling.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolingFiles {
    /// The pooling its sentence-transformers modules or GGUF name; `None`
    /// when they name none (a model not made to embed).
    pub pooling: Option<Pooling>,
    /// Matryoshka sizes a vector may be cut to (`dimensions`): `None` when
    /// the model was not trained for it; an empty list when any size is.
    pub matryoshka: Option<Vec<usize>>,
    /// `config.json` names a `*ForSequenceClassification` architecture, or
    /// GGUF's pooling type is llama.cpp's `rank`: a cross-encoder, which
    /// scores pairs.
    pub classifier: bool,
    /// The classifier is a decoder's "yes" and "no" rows (llama.cpp's GGUF
    /// of Qwen3-Reranker: `cls.output` with those labels), scored on the
    /// reranker's own prompt.
    pub yes_no: bool,
    /// The Dense modules after the pooling, in order.
    pub dense: Vec<DenseModule>,
    /// The prompts a request may name.
    pub prompts: Prompts,
}

/// One entry of `modules.json`.
#[derive(Debug, Deserialize)]
struct Module {
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

/// The Pooling module's `config.json`: `pooling_mode` (sentence-transformers
/// 6), or a flag per mode, one set (earlier versions).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PoolingModule {
    pooling_mode: Option<String>,
    pooling_mode_cls_token: bool,
    pooling_mode_mean_tokens: bool,
    pooling_mode_lasttoken: bool,
    pooling_mode_max_tokens: bool,
    pooling_mode_mean_sqrt_len_tokens: bool,
    pooling_mode_weightedmean_tokens: bool,
    include_prompt: Option<bool>,
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })
}

fn parse<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| Error::Corrupt {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// What `dir` (a Hugging Face directory) says about pooling.
pub fn from_dir(dir: &Path) -> Result<PoolingFiles> {
    let config = HfConfig::parse(&read(&dir.join("config.json"))?)?;
    let matryoshka = matryoshka(&config)?;
    let classifier =
        (config.family_names().iter()).any(|n| n.ends_with("ForSequenceClassification"));
    let modules = dir.join("modules.json");
    let mut files = PoolingFiles {
        matryoshka,
        classifier,
        ..PoolingFiles::default()
    };
    if !modules.exists() {
        return Ok(files);
    }
    let list: Vec<Module> = parse(&modules, &read(&modules)?)?;
    let mut method = None;
    let mut normalize = false;
    let mut with_prompt = true;
    for m in &list {
        let path = dir.join(&m.path).join("config.json");
        match m.kind.rsplit('.').next().unwrap_or_default() {
            "Transformer" => {}
            "Normalize" => normalize = true,
            "Pooling" => {
                let config: PoolingModule = parse(&path, &read(&path)?)?;
                with_prompt = config.include_prompt.unwrap_or(true);
                method = Some(pooling_method(&path, &config)?);
            }
            "Dense" => files
                .dense
                .push(DenseModule::from_config(&dir.join(&m.path), &read(&path)?)?),
            _ => {
                return Err(Error::Config(format!(
                    "modules.json names a {} module ({}), which is not served: \
                     its vectors would be wrong",
                    m.kind, m.path
                )));
            }
        }
    }
    let st = dir.join("config_sentence_transformers.json");
    if st.exists() {
        files.prompts = Prompts::parse(&read(&st)?, with_prompt)?;
    }
    let Some(method) = method else {
        // A cross-encoder (sentence-transformers' CrossEncoder) scores
        // through its classifier and pools nothing.
        return match classifier {
            true => Ok(files),
            false => Err(Error::Config("modules.json names no Pooling module".into())),
        };
    };
    files.pooling = Some(Pooling { method, normalize });
    Ok(files)
}

/// The method a Pooling module's config sets.
fn pooling_method(path: &Path, p: &PoolingModule) -> Result<PoolingMethod> {
    if let Some(mode) = &p.pooling_mode {
        return mode.parse().map_err(|_| {
            Error::Config(format!(
                "{}: {mode} pooling is not served ({})",
                path.display(),
                PoolingMethod::NAMES.join(", ")
            ))
        });
    }
    let unserved = [
        (p.pooling_mode_max_tokens, "max"),
        (p.pooling_mode_mean_sqrt_len_tokens, "mean_sqrt_len"),
        (p.pooling_mode_weightedmean_tokens, "weightedmean"),
    ];
    if let Some((_, name)) = unserved.iter().find(|(on, _)| *on) {
        return Err(Error::Config(format!(
            "{}: {name} pooling is not served ({})",
            path.display(),
            PoolingMethod::NAMES.join(", ")
        )));
    }
    let set = [
        (p.pooling_mode_cls_token, PoolingMethod::Cls),
        (p.pooling_mode_mean_tokens, PoolingMethod::Mean),
        (p.pooling_mode_lasttoken, PoolingMethod::Last),
    ];
    let mut on = set.iter().filter(|(on, _)| *on).map(|&(_, m)| m);
    match (on.next(), on.next()) {
        (Some(m), None) => Ok(m),
        _ => Err(Error::Config(format!(
            "{}: exactly one pooling mode must be set",
            path.display()
        ))),
    }
}

/// The Matryoshka sizes `config.json` names.
fn matryoshka(c: &HfConfig) -> Result<Option<Vec<usize>>> {
    if c.has("matryoshka_dimensions") {
        return Ok(Some(c.usizes("matryoshka_dimensions")?));
    }
    Ok(c.bool_or("is_matryoshka", false)?.then(Vec::new))
}

/// What a GGUF's metadata says: its pooling type, and the Dense modules
/// llama.cpp's converter writes as `dense_2` and `dense_3` (bias-free,
/// identity, their widths in `{arch}.dense_N_feat_in` and `_out`).
pub fn from_gguf(md: &Metadata<'_>) -> Result<PoolingFiles> {
    let mut files = from_gguf_type(md.usize_opt("pooling_type")?)?;
    // A classifier's labels say cross-encoder too (llama.cpp writes no
    // pooling type for a BERT one: its server is told `--reranking`).
    let labels = md.strings_opt("classifier.output_labels");
    files.classifier |= labels.is_some();
    files.yes_no = files.classifier && labels.is_some_and(|l| l == ["yes", "no"]);
    for name in ["dense_2", "dense_3"] {
        let width = |end: &str| md.usize_opt(&format!("{name}_feat_{end}"));
        if let (Some(in_features), Some(out_features)) = (width("in")?, width("out")?) {
            files.dense.push(DenseModule {
                weights: DenseWeights::Tensor(name.to_string()),
                in_features,
                out_features,
                bias: false,
                activation: ModuleActivation::Identity,
            });
        }
    }
    Ok(files)
}

/// llama.cpp's `pooling_type` of a reranker.
const RANK: usize = 4;

/// What GGUF's `pooling_type` says (`0` or absent: none; 4, llama.cpp's
/// rank: a cross-encoder's classifier).
pub fn from_gguf_type(pooling_type: Option<usize>) -> Result<PoolingFiles> {
    let pooling = match pooling_type {
        None | Some(0) => None,
        Some(RANK) => {
            return Ok(PoolingFiles {
                classifier: true,
                ..PoolingFiles::default()
            });
        }
        Some(n) => {
            let method = u32::try_from(n)
                .ok()
                .and_then(PoolingMethod::from_gguf)
                .ok_or_else(|| {
                    Error::Config(format!(
                        "GGUF pooling_type {n} is not served (1 mean, 2 cls, 3 last, 4 rank)"
                    ))
                })?;
            // llama.cpp normalizes every embedding it returns.
            Some(Pooling {
                method,
                normalize: true,
            })
        }
    };
    Ok(PoolingFiles {
        pooling,
        ..PoolingFiles::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, files: &[(&str, &str)]) {
        for (name, text) in files {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
    }

    const MODULES: &str = r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
        {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
        {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#;

    #[test]
    fn sentence_transformers_files_name_the_pooling() {
        type Case<'a> = (
            &'a str,
            &'a str,
            &'a str,
            std::result::Result<Option<Pooling>, &'a str>,
        );
        let p = |method, normalize| Ok(Some(Pooling { method, normalize }));
        let cases: [Case; 9] = [
            ("{}", "", "", Ok(None)),
            (
                "{}",
                MODULES,
                r#"{"pooling_mode_cls_token": true}"#,
                p(PoolingMethod::Cls, true),
            ),
            (
                "{}",
                MODULES,
                r#"{"pooling_mode_lasttoken": true}"#,
                p(PoolingMethod::Last, true),
            ),
            (
                "{}",
                &MODULES.replace("Normalize\"", "Unknown\""),
                r#"{"pooling_mode_mean_tokens": true}"#,
                Err("Unknown module"),
            ),
            (
                "{}",
                MODULES,
                r#"{"pooling_mode_max_tokens": true}"#,
                Err("max pooling is not served"),
            ),
            (
                "{}",
                MODULES,
                r#"{"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": true}"#,
                Err("exactly one"),
            ),
            (
                "{}",
                MODULES,
                r#"{"pooling_mode": "mean"}"#,
                p(PoolingMethod::Mean, true),
            ),
            (
                "{}",
                MODULES,
                r#"{"pooling_mode": "lasttoken"}"#,
                p(PoolingMethod::Last, true),
            ),
            (
                "{}",
                MODULES,
                r#"{"pooling_mode": "max"}"#,
                Err("max pooling is not served"),
            ),
        ];
        for (config, modules, pooling, want) in cases {
            let dir = tempfile::tempdir().unwrap();
            write(
                dir.path(),
                &[("config.json", config), ("1_Pooling/config.json", pooling)],
            );
            if !modules.is_empty() {
                write(dir.path(), &[("modules.json", modules)]);
            }
            match (from_dir(dir.path()), want) {
                (Ok(got), Ok(w)) => assert_eq!(got.pooling, w, "{modules} {pooling}"),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{e}"),
                (got, w) => panic!("{modules} {pooling}: {got:?} vs {w:?}"),
            }
        }
    }

    #[test]
    fn dense_modules_and_prompts_are_read_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let modules = MODULES.replace(
            r#"{"idx":2,"#,
            r#"{"idx":2,"name":"2","path":"2_Dense","type":"sentence_transformers.models.Dense"},
            {"idx":3,"name":"3","path":"3_Dense","type":"sentence_transformers.models.Dense"},
            {"idx":4,"#,
        );
        let dense = |i, o| format!(r#"{{"in_features": {i}, "out_features": {o}, "bias": false}}"#);
        write(
            dir.path(),
            &[
                ("config.json", "{}"),
                ("modules.json", &modules),
                ("1_Pooling/config.json", r#"{"pooling_mode": "mean"}"#),
                ("2_Dense/config.json", &dense(4, 8)),
                ("3_Dense/config.json", &dense(8, 4)),
                (
                    "config_sentence_transformers.json",
                    r#"{"prompts": {"query": "q: "}, "default_prompt_name": "query"}"#,
                ),
            ],
        );
        let files = from_dir(dir.path()).unwrap();
        let widths: Vec<_> = (files.dense.iter())
            .map(|d| (d.in_features, d.out_features, &d.weights))
            .collect();
        let file = |d: &str| DenseWeights::File(dir.path().join(d).join("model.safetensors"));
        assert_eq!(widths, [(4, 8, &file("2_Dense")), (8, 4, &file("3_Dense"))]);
        assert_eq!(files.prompts.text(None), Ok(Some("q: ")));
        assert!(files.pooling.unwrap().normalize);
    }

    #[test]
    fn matryoshka_sizes_come_from_config_json() {
        for (config, want) in [
            ("{}", None),
            (r#"{"matryoshka_dimensions": [16, 32]}"#, Some(vec![16, 32])),
            (r#"{"is_matryoshka": true}"#, Some(vec![])),
        ] {
            let dir = tempfile::tempdir().unwrap();
            write(dir.path(), &[("config.json", config)]);
            assert_eq!(from_dir(dir.path()).unwrap().matryoshka, want, "{config}");
        }
    }

    #[test]
    fn gguf_pooling_types_map_to_methods() {
        let got = |n| from_gguf_type(n).map(|f| f.pooling.map(|p| p.method));
        assert_eq!(got(None).unwrap(), None);
        assert_eq!(got(Some(0)).unwrap(), None);
        assert_eq!(got(Some(1)).unwrap(), Some(PoolingMethod::Mean));
        assert_eq!(got(Some(2)).unwrap(), Some(PoolingMethod::Cls));
        assert_eq!(got(Some(3)).unwrap(), Some(PoolingMethod::Last));
        // llama.cpp's rank: a cross-encoder, pooled as its head reads.
        assert_eq!(got(Some(4)).unwrap(), None);
        assert!(from_gguf_type(Some(4)).unwrap().classifier);
        assert!(got(Some(5)).is_err());
    }
}
