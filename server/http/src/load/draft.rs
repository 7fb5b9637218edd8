//! The draft model of `--speculative-config`: loaded by the target's own
//! loader (any family and file Ferrox loads), on the same device, with its
//! own KV pool; refused at start where its vocabulary is not the target's
//! or its cache cannot roll a rejected draft token back.

use std::path::Path;

use anyhow::Context;
use ferrox_core::{Pool, Tokenizer};
use ferrox_models::mixer::attention::AttentionBackend;
use ferrox_models::{Decoder, Device, PagedModel, Source};
use ferrox_plan::{CacheKind, DeviceKind, DraftPlan, KvDtype};

/// How the draft runs beside the target, and the target's tokenizer it
/// must share.
#[derive(Clone, Copy)]
pub struct DraftSetup<'a> {
    /// The target's tokenizer.
    pub tokenizer: &'a Tokenizer,
    /// The device the target runs on.
    pub device: &'a Device,
    /// The longest sequence served (the RoPE tables' length).
    pub max_model_len: usize,
    /// The attention backend the target runs (`--attention-backend`): the
    /// draft runs the same.
    pub attention: AttentionBackend,
}

/// The draft's pool: as many blocks as the target's full-attention pool,
/// of the target's block size and KV dtype.
#[derive(Debug, Clone, Copy)]
pub struct DraftPool {
    /// Blocks of the draft's pool.
    pub blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// The KV dtype.
    pub kv_dtype: KvDtype,
}

/// Loads the draft model's weights at `path`, refused where its vocabulary
/// is not the target's or it keeps more than full attention; its pool is
/// [`with_pool`]'s, once the plan is final (a GPU profiles its activations
/// first).
pub fn open_draft(path: &Path, setup: &DraftSetup<'_>) -> anyhow::Result<Decoder> {
    let shown = path.display();
    let mut source = Source::open(path).with_context(|| format!("opening the draft {shown}"))?;
    let text = source
        .text()
        .with_context(|| format!("loading the draft's tokenizer ({shown})"))?;
    if let Some(why) = vocab_mismatch(setup.tokenizer, &text.tokenizer) {
        anyhow::bail!(
            "the draft model {shown} does not share the target's tokenizer ({why}): its draft \
             tokens would mean other text"
        );
    }
    let mut decoder = source
        .decoder(setup.device)
        .with_context(|| format!("loading the draft's weights ({shown})"))?;
    let kinds = decoder.cache_kinds();
    anyhow::ensure!(
        kinds == [CacheKind::Full],
        "the draft model {shown} keeps a {} cache: only a draft of full attention alone can \
         drop a rejected draft token",
        ferrox_plan::spell_kinds(&kinds)
    );
    decoder.set_fused_attention(setup.attention == AttentionBackend::Paged);
    decoder
        .set_context(setup.max_model_len)
        .context("building the draft's RoPE tables")?;
    Ok(decoder)
}

/// The draft `decoder` with its own KV pool.
pub fn with_pool(decoder: Decoder, pool: DraftPool) -> anyhow::Result<PagedModel> {
    let full = Pool {
        kind: CacheKind::Full,
        blocks: pool.blocks,
    };
    PagedModel::with_pools(decoder, &[full], pool.block_size, pool.kv_dtype)
        .context("allocating the draft's KV cache")
}

/// What the draft model at `path` adds to the plan on `device`, its KV
/// held in the target's `kv_dtype`; read before any weight is.
pub fn plan(path: &Path, device: DeviceKind, kv_dtype: KvDtype) -> anyhow::Result<DraftPlan> {
    let mut source = Source::open(path)
        .with_context(|| format!("opening the draft model {}", path.display()))?;
    let info = source.info()?;
    let geometry = info.geometry(device, kv_dtype);
    Ok(DraftPlan {
        weight_bytes: geometry.weight_bytes,
        kv_bytes_per_token: geometry.kv_bytes_per_token(),
    })
}

/// Why `draft` is not `target`'s tokenizer, if it is not: another number
/// of ids, or an id that is another token (the first one found).
pub fn vocab_mismatch(target: &Tokenizer, draft: &Tokenizer) -> Option<String> {
    let (t, d) = (target.vocab_size(), draft.vocab_size());
    if t != d {
        return Some(format!("a vocabulary of {d} tokens, the target's {t}"));
    }
    let ids = 0..u32::try_from(t).unwrap_or(u32::MAX);
    ids.map(|id| (id, target.id_to_token(id), draft.id_to_token(id)))
        .find(|(_, a, b)| a != b)
        .map(|(id, a, b)| {
            let a = a.unwrap_or_else(|| "nothing".into());
            let b = b.unwrap_or_else(|| "nothing".into());
            format!("id {id} is {b:?} in the draft's vocabulary, {a:?} in the target's")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn family(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../models/testdata/families")
            .join(name)
    }

    fn tokenizer(name: &str) -> Tokenizer {
        Tokenizer::from_file(family(name).join("tokenizer.json")).unwrap()
    }

    #[test]
    fn a_draft_of_another_vocabulary_is_refused_with_the_reason() {
        let llama = tokenizer("llama");
        // Another family with the same tokenizer: the same vocabulary.
        assert_eq!(vocab_mismatch(&llama, &tokenizer("qwen3")), None);
        let glm = tokenizer("glm4moe");
        let why = vocab_mismatch(&llama, &glm).expect("another tokenizer");
        assert!(why.contains("vocabulary") || why.contains("id "), "{why}");
        // Through the loader: refused before any weight is read.
        let setup = DraftSetup {
            tokenizer: &llama,
            device: &Device::Cpu,
            max_model_len: 64,
            attention: AttentionBackend::Paged,
        };
        let err = open_draft(&family("glm4moe"), &setup).unwrap_err();
        let err = format!("{err:#}");
        assert!(
            err.contains("does not share the target's tokenizer"),
            "{err}"
        );
        // A draft of another family that shares it loads, with its pool.
        let pool = DraftPool {
            blocks: 8,
            block_size: 4,
            kv_dtype: KvDtype::F32,
        };
        let draft = with_pool(open_draft(&family("qwen3"), &setup).unwrap(), pool).unwrap();
        use ferrox_core::BatchModel;
        assert_eq!(
            draft.cache_pools(),
            vec![Pool {
                kind: CacheKind::Full,
                blocks: 8
            }]
        );
        assert!(draft.decoder().fused_attention());
        // It runs the attention backend the target runs.
        let gather = DraftSetup {
            attention: AttentionBackend::Gather,
            ..setup
        };
        assert!(
            !open_draft(&family("qwen3"), &gather)
                .unwrap()
                .fused_attention()
        );
        // Its plan: its weights, and its KV per token in the target's dtype.
        let p = plan(&family("qwen3"), DeviceKind::Cpu, KvDtype::F32).unwrap();
        assert!(p.weight_bytes > 0);
        assert_eq!(p.kv_bytes_per_token % (2 * 4), 0, "{p:?}");
        let f16 = plan(&family("qwen3"), DeviceKind::Cpu, KvDtype::F16).unwrap();
        assert_eq!(f16.kv_bytes_per_token * 2, p.kv_bytes_per_token);
        // A windowed draft is refused with the reason.
        let err = format!("{:#}", open_draft(&family("mistral"), &setup).unwrap_err());
        assert!(err.contains("full attention alone"), "{err}");
    }
}
