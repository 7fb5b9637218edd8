//! Where each family keeps its cross-encoder head and what the head does
//! between the pooled state and the classifier, as one table rather than
//! code per family. llama.cpp names the head's layers `cls` (the dense
//! layer), `cls.norm` and `cls.output` (the classifier); the table maps
//! those to each family's checkpoint names:
//!
//! - BERT and NomicBERT: the pooler (`pooler.dense`, inside the encoder,
//!   then tanh) on the first token, then `classifier`;
//! - XLM-RoBERTa: `classifier.dense` and tanh, then `classifier.out_proj`;
//! - ModernBERT: `head.dense` (bias per `classifier_bias`), the
//!   `classifier_activation`, the LayerNorm `head.norm` (bias per
//!   `norm_bias`), then `classifier`, on the first token or the mean of all
//!   (`classifier_pooling`);
//! - a decoder (`Qwen3ForSequenceClassification`): `score` alone on the last
//!   token.

use crate::config::{HfConfig, Metadata};
use crate::error::{Error, Result};
use crate::pooling::PoolingMethod;
use crate::spec::Activation;

/// What the head does before its classifier.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HeadTransform {
    /// Nothing: the classifier reads the pooled state (a decoder's `score`).
    Linear,
    /// BERT's pooler: a dense layer, then tanh.
    Pooler,
    /// ModernBERT's prediction head: a dense layer, `activation`, then a
    /// LayerNorm of epsilon `eps`.
    Prediction {
        /// The activation after the dense layer.
        activation: Activation,
        /// The LayerNorm's epsilon (the model's `norm_eps`).
        eps: f64,
    },
}

/// The kinds of head in the table (the settings come from the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Linear,
    Pooler,
    Prediction,
}

/// One head layout: the families that have it and its tensors' names.
#[derive(Debug)]
pub struct HeadLayout {
    /// llama.cpp's names of the families with this head.
    families: &'static [&'static str],
    kind: Kind,
    /// The dense layer's name, and whether it sits under the encoder's
    /// prefix (BERT's pooler is part of `BertModel`) or beside it.
    dense: (&'static str, bool),
    /// The LayerNorm after the activation (ModernBERT's), beside the encoder.
    norm: &'static str,
    /// The classifier's name, beside the encoder.
    out: &'static str,
}

/// Every encoder's head; a family not here has a decoder's.
static LAYOUTS: [HeadLayout; 3] = [
    HeadLayout {
        families: &["bert", "nomic-bert"],
        kind: Kind::Pooler,
        dense: ("pooler.dense", true),
        norm: "",
        out: "classifier",
    },
    HeadLayout {
        families: &["xlm-roberta"],
        kind: Kind::Pooler,
        dense: ("classifier.dense", false),
        norm: "",
        out: "classifier.out_proj",
    },
    HeadLayout {
        families: &["modern-bert"],
        kind: Kind::Prediction,
        dense: ("head.dense", false),
        norm: "head.norm",
        out: "classifier",
    },
];

/// A decoder's head (`*ForSequenceClassification`): one linear, `score`.
static DECODER: HeadLayout = HeadLayout {
    families: &[],
    kind: Kind::Linear,
    dense: ("", false),
    norm: "",
    out: "score",
};

impl HeadLayout {
    /// The layout of the family llama.cpp names `family`.
    pub fn of(family: &str) -> &'static HeadLayout {
        LAYOUTS
            .iter()
            .find(|l| l.families.contains(&family))
            .unwrap_or(&DECODER)
    }

    /// The checkpoint's name of the head tensor llama.cpp names
    /// `cls.{part}` (`weight`, `norm.bias`, `output.weight`, ...), `prefix`
    /// the encoder's.
    pub fn checkpoint_name(&self, prefix: &str, part: &str) -> String {
        if let Some(p) = part.strip_prefix("output.") {
            return format!("{}.{p}", self.out);
        }
        if let Some(p) = part.strip_prefix("norm.") {
            return format!("{}.{p}", self.norm);
        }
        let (dense, inside) = self.dense;
        let prefix = if inside { prefix } else { "" };
        format!("{prefix}{dense}.{part}")
    }
}

/// A cross-encoder's head as its family's layout and its config say.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeadSpec {
    /// What it does before the classifier.
    pub transform: HeadTransform,
    /// The dense layer has a bias (`cls.bias`).
    pub dense_bias: bool,
    /// The LayerNorm has a bias (`cls.norm.bias`).
    pub norm_bias: bool,
    /// The classifier must have a bias: an encoder's does; a decoder's
    /// `score` has none, or one where the file holds it.
    pub out_bias: bool,
    /// Which tokens' states the head reads.
    pub pooling: PoolingMethod,
}

impl HeadSpec {
    /// The head of `family` (llama.cpp's name), an encoder's when
    /// `encoder`, norm epsilon `eps`, its settings from `config.json`
    /// (`None` for GGUF: transformers' defaults).
    pub fn read(family: &str, encoder: bool, config: Option<&HfConfig>, eps: f64) -> Result<Self> {
        let layout = HeadLayout::of(family);
        // An encoder without a classifier layout of its own reads the
        // first token as BERT's does; a decoder reads its last.
        let first = match encoder {
            true => PoolingMethod::Cls,
            false => PoolingMethod::Last,
        };
        let str_of = |key: &str| config.and_then(|c| c.str_opt(key));
        let bool_of = |key: &str| config.map_or(Ok(false), |c| c.bool_or(key, false));
        Ok(match layout.kind {
            Kind::Linear => HeadSpec {
                transform: HeadTransform::Linear,
                dense_bias: false,
                norm_bias: false,
                out_bias: false,
                pooling: first,
            },
            Kind::Pooler => HeadSpec {
                transform: HeadTransform::Pooler,
                dense_bias: true,
                norm_bias: false,
                out_bias: true,
                pooling: PoolingMethod::Cls,
            },
            Kind::Prediction => HeadSpec {
                transform: HeadTransform::Prediction {
                    activation: Activation::from_hf(
                        "classifier_activation",
                        str_of("classifier_activation"),
                    )?,
                    eps,
                },
                dense_bias: bool_of("classifier_bias")?,
                norm_bias: bool_of("norm_bias")?,
                out_bias: true,
                pooling: pooling(str_of("classifier_pooling"))?,
            },
        })
    }
}

/// The head settings a GGUF carries, as the `config.json` keys they come
/// from: llama.cpp's converter writes ModernBERT's `classifier_pooling` as
/// `{arch}.classifier.pooling_type` (1 mean, 2 cls); the rest are
/// transformers' defaults.
pub fn gguf_head_config(md: &Metadata<'_>) -> Result<HfConfig> {
    let pooling = match md.usize_opt("classifier.pooling_type")? {
        None => None,
        Some(1) => Some("mean"),
        Some(2) => Some("cls"),
        Some(n) => {
            return Err(Error::Config(format!(
                "classifier.pooling_type {n} is not served (1 mean, 2 cls)"
            )));
        }
    };
    HfConfig::parse(&serde_json::json!({ "classifier_pooling": pooling }).to_string())
}

/// ModernBERT's `classifier_pooling`: the first token's state, or the mean
/// of all the sequence's.
fn pooling(name: Option<&str>) -> Result<PoolingMethod> {
    match name.unwrap_or("cls") {
        "cls" => Ok(PoolingMethod::Cls),
        "mean" => Ok(PoolingMethod::Mean),
        other => Err(Error::Config(format!(
            "the classifier_pooling {other:?} is not served (cls, mean)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_family_names_its_head_tensors() {
        let name = |family: &str, part: &str| HeadLayout::of(family).checkpoint_name("p.", part);
        let cases = [
            ("bert", "weight", "p.pooler.dense.weight"),
            ("bert", "output.bias", "classifier.bias"),
            ("nomic-bert", "bias", "p.pooler.dense.bias"),
            ("nomic-bert", "output.weight", "classifier.weight"),
            ("xlm-roberta", "weight", "classifier.dense.weight"),
            ("xlm-roberta", "output.weight", "classifier.out_proj.weight"),
            ("modern-bert", "weight", "head.dense.weight"),
            ("modern-bert", "norm.weight", "head.norm.weight"),
            ("modern-bert", "output.bias", "classifier.bias"),
            ("qwen3", "output.weight", "score.weight"),
        ];
        for (family, part, want) in cases {
            assert_eq!(name(family, part), want, "{family} {part}");
        }
    }

    #[test]
    fn modernbert_reads_its_pooling_activation_and_biases_from_the_config() {
        let config = |text: &str| HfConfig::parse(text).unwrap();
        let gte = config(
            r#"{"classifier_pooling":"mean","classifier_activation":"gelu",
            "classifier_bias":false,"norm_bias":false}"#,
        );
        let head = HeadSpec::read("modern-bert", true, Some(&gte), 1e-5).unwrap();
        let want = HeadTransform::Prediction {
            activation: Activation::Gelu,
            eps: 1e-5,
        };
        assert_eq!(head.transform, want);
        assert_eq!(head.pooling, PoolingMethod::Mean);
        assert!(!head.dense_bias && !head.norm_bias && head.out_bias);
        let biased = config(r#"{"classifier_bias":true,"norm_bias":true}"#);
        let head = HeadSpec::read("modern-bert", true, Some(&biased), 1e-5).unwrap();
        assert_eq!(head.pooling, PoolingMethod::Cls);
        assert!(head.dense_bias && head.norm_bias);
        for bad in [
            r#"{"classifier_pooling":"max"}"#,
            r#"{"classifier_activation":"relu"}"#,
        ] {
            let err = HeadSpec::read("modern-bert", true, Some(&config(bad)), 1e-5).unwrap_err();
            assert!(err.to_string().contains("classifier_"), "{bad}: {err}");
        }
    }

    #[test]
    fn bert_pools_its_first_token_and_a_decoder_its_last() {
        let bert = HeadSpec::read("nomic-bert", true, None, 1e-12).unwrap();
        assert_eq!(bert.transform, HeadTransform::Pooler);
        assert_eq!(bert.pooling, PoolingMethod::Cls);
        assert!(bert.dense_bias && bert.out_bias);
        let qwen = HeadSpec::read("qwen3", false, None, 1e-6).unwrap();
        assert_eq!(qwen.transform, HeadTransform::Linear);
        assert_eq!(qwen.pooling, PoolingMethod::Last);
        assert!(!qwen.out_bias);
    }

    #[test]
    fn a_gguf_s_classifier_pooling_type_reads_as_modernbert_s_config() {
        use candle_core::quantized::gguf_file::Value;
        let head = |pooling: Option<u32>| {
            let md: std::collections::HashMap<String, Value> = pooling
                .map(|n| ("modern-bert.classifier.pooling_type".into(), Value::U32(n)))
                .into_iter()
                .collect();
            let md = Metadata {
                md: &md,
                arch: "modern-bert",
            };
            let config = gguf_head_config(&md)?;
            HeadSpec::read("modern-bert", true, Some(&config), 1e-5)
        };
        // Absent: transformers' default, the first token.
        for (n, want) in [
            (None, PoolingMethod::Cls),
            (Some(1), PoolingMethod::Mean),
            (Some(2), PoolingMethod::Cls),
        ] {
            assert_eq!(head(n).unwrap().pooling, want, "{n:?}");
        }
        let err = head(Some(3)).unwrap_err().to_string();
        assert!(err.contains("classifier.pooling_type 3"), "{err}");
    }
}
