//! A tokenizer vocabulary as GGUF metadata carries it, and how to turn it into
//! a `tokenizers` pipeline equivalent to llama.cpp's.

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Merges, Vocab};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior,
};

use crate::error::Error;

/// GGUF token type of a control token (`<s>`, `<|im_start|>`).
pub const TOKEN_TYPE_CONTROL: i32 = 3;
/// GGUF token type of a user-defined token, matched whole like a control token.
pub const TOKEN_TYPE_USER_DEFINED: i32 = 4;
/// GGUF token type of a byte-fallback token (`<0x0A>`).
pub const TOKEN_TYPE_BYTE: i32 = 6;

/// Llama 3's split regex (llama.cpp `llama-bpe`).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split regex: like Llama 3's but one digit per piece.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-4o's split regex (llama.cpp `gpt-4o`: Phi-4's vocabulary), as its
/// `tokenizer.json` has it: cased words with their contraction, digits in
/// threes.
const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The tokenizer part of a GGUF file's metadata, as plain data.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE), `"llama"`
    /// (SentencePiece BPE), `"gemma4"` (SentencePiece-style BPE from
    /// merges), `"bert"` (WordPiece) or `"t5"` (Unigram).
    pub model: String,
    /// `tokenizer.ggml.pre`: names the pre-tokenizer regex of a gpt2 vocabulary.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, indexed by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores`, indexed by id.
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type`, indexed by id.
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges`, `"left right"` in rank order.
    pub merges: Option<Vec<String>>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`.
    pub eot_id: Option<u32>,
    /// `tokenizer.ggml.eom_token_id`.
    pub eom_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.seperator_token_id` (llama.cpp's spelling).
    pub sep_id: Option<u32>,
    /// `tokenizer.ggml.add_sep_token`: a separator between a pair's texts.
    pub add_sep: Option<bool>,
    /// `tokenizer.ggml.precompiled_charsmap`: SentencePiece's normalization.
    pub precompiled_charsmap: Option<Vec<u8>>,
    /// `tokenizer.ggml.add_space_prefix`: a `▁` before the text.
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.ggml.remove_extra_whitespaces`: ends stripped, runs merged.
    pub remove_extra_whitespaces: Option<bool>,
}

impl GgufVocab {
    /// The text of token `id`, if it exists.
    pub fn token(&self, id: Option<u32>) -> Option<&str> {
        id.and_then(|i| self.tokens.get(i as usize))
            .map(String::as_str)
    }

    /// Whether BOS is added to encoded text; llama.cpp's default is per model type.
    pub fn adds_bos(&self) -> bool {
        self.add_bos.unwrap_or(self.model == "llama")
    }

    fn token_type(&self, id: usize) -> i32 {
        self.token_types
            .as_ref()
            .and_then(|t| t.get(id).copied())
            .unwrap_or(1)
    }

    /// Checks lengths and ids so that building never indexes out of range.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        let n = self.tokens.len();
        if n == 0 {
            return Err(Error::InvalidVocab("no tokens".into()));
        }
        if self.scores.as_ref().is_some_and(|s| s.len() != n) {
            return Err(Error::InvalidVocab(format!(
                "{n} tokens but a different number of scores"
            )));
        }
        if self.token_types.as_ref().is_some_and(|t| t.len() != n) {
            return Err(Error::InvalidVocab(format!(
                "{n} tokens but a different number of token types"
            )));
        }
        let ids = [
            self.bos_id,
            self.eos_id,
            self.unk_id,
            self.eot_id,
            self.eom_id,
            self.sep_id,
        ];
        if let Some(bad) = ids.into_iter().flatten().find(|&i| i as usize >= n) {
            return Err(Error::InvalidVocab(format!(
                "special token id {bad} >= vocab size {n}"
            )));
        }
        Ok(())
    }

    /// Tokens to match whole in input text: control and user-defined tokens,
    /// plus the special ids the metadata names.
    pub(crate) fn added_tokens(&self) -> Vec<AddedToken> {
        let named = [
            self.bos_id,
            self.eos_id,
            self.unk_id,
            self.eot_id,
            self.eom_id,
        ];
        let mut out = Vec::new();
        for (id, text) in self.tokens.iter().enumerate() {
            let ty = self.token_type(id);
            let is_named = named.contains(&Some(id as u32));
            if ty == TOKEN_TYPE_CONTROL || is_named {
                out.push(AddedToken::from(text.clone(), true));
            } else if ty == TOKEN_TYPE_USER_DEFINED {
                out.push(AddedToken::from(text.clone(), false).normalized(false));
            }
        }
        out
    }

    fn vocab_map(&self) -> Vocab {
        self.tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect()
    }

    /// Byte-level BPE model from explicit merges (gpt2-style vocabularies).
    pub(crate) fn gpt2_model(&self) -> Result<BPE, Error> {
        BPE::builder()
            .vocab_and_merges(self.vocab_map(), self.merge_list()?)
            .build()
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// SentencePiece-style BPE from explicit merges over raw text, unknown
    /// characters as byte tokens (llama.cpp's `gemma4` vocabulary).
    pub(crate) fn gemma4_model(&self) -> Result<BPE, Error> {
        BPE::builder()
            .vocab_and_merges(self.vocab_map(), self.merge_list()?)
            .byte_fallback(true)
            .build()
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// The metadata's merges, each `left right`.
    fn merge_list(&self) -> Result<Merges, Error> {
        let merges = self
            .merges
            .as_ref()
            .ok_or_else(|| Error::InvalidVocab("gpt2 vocabulary without merges".into()))?;
        let merges: Merges = merges
            .iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| Error::InvalidVocab(format!("merge {m:?} has no space")))
            })
            .collect::<Result<_, _>>()?;
        Ok(merges)
    }

    /// SentencePiece-equivalent BPE: merges derived from the vocabulary, ranked
    /// by the merged token's score, with byte fallback.
    pub(crate) fn llama_model(&self) -> Result<BPE, Error> {
        let scores = self
            .scores
            .as_ref()
            .ok_or_else(|| Error::InvalidVocab("llama vocabulary without scores".into()))?;
        let vocab = self.vocab_map();
        let mut ranked: Vec<(f32, u32, String, String)> = Vec::new();
        for (id, piece) in self.tokens.iter().enumerate() {
            let ty = self.token_type(id);
            if ty == TOKEN_TYPE_BYTE || ty == TOKEN_TYPE_CONTROL || piece.chars().count() < 2 {
                continue;
            }
            for (split, _) in piece.char_indices().skip(1) {
                let (left, right) = piece.split_at(split);
                if let (Some(&l), Some(&r)) = (vocab.get(left), vocab.get(right)) {
                    // Ties go to the pair whose parts rank first, as SentencePiece does.
                    ranked.push((scores[id], l.max(r), left.to_string(), right.to_string()));
                }
            }
        }
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let merges: Merges = ranked.into_iter().map(|(_, _, l, r)| (l, r)).collect();
        let mut builder = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .byte_fallback(true)
            .fuse_unk(true);
        if let Some(unk) = self.token(self.unk_id) {
            builder = builder.unk_token(unk.to_string());
        }
        builder.build().map_err(|e| Error::Tokenizer(e.to_string()))
    }
}

/// The pre-tokenizer a gpt2-style vocabulary's `pre` names.
pub(crate) fn gpt2_pre_tokenizer(pre: Option<&str>) -> Result<PreTokenizerWrapper, Error> {
    let byte_level_with_regex = ByteLevel::new(false, true, true);
    let split_then_bytes = |regex: &str| -> Result<PreTokenizerWrapper, Error> {
        let split = Split::new(
            SplitPattern::Regex(regex.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(PreSequence::new(vec![
            split.into(),
            ByteLevel::new(false, true, false).into(),
        ])
        .into())
    };
    match pre.unwrap_or("default") {
        // llama.cpp names GPT-2's own `gpt-2`.
        "default" | "gpt2" | "gpt-2" => Ok(byte_level_with_regex.into()),
        // SmolLM's tokenizer.json: each digit alone, then the GPT-2 regex.
        "smollm" => {
            Ok(
                PreSequence::new(vec![Digits::new(true).into(), byte_level_with_regex.into()])
                    .into(),
            )
        }
        "llama-bpe" | "llama3" => split_then_bytes(LLAMA3_SPLIT),
        "qwen2" => split_then_bytes(QWEN2_SPLIT),
        "gpt-4o" => split_then_bytes(GPT4O_SPLIT),
        other => Err(Error::UnknownPreTokenizer(other.to_string())),
    }
}

/// SentencePiece's normaliser: a leading `▁`, and every space as `▁`.
pub(crate) fn llama_normalizer() -> Result<NormalizerWrapper, Error> {
    let replace = Replace::new(" ", "▁").map_err(|e| Error::Tokenizer(e.to_string()))?;
    Ok(NormalizerSequence::new(vec![Prepend::new("▁".into()).into(), replace.into()]).into())
}

/// Gemma 4's normaliser: every space as `▁` (no prefix: llama.cpp's
/// `add_space_prefix` is false for it).
pub(crate) fn gemma4_normalizer() -> Result<NormalizerWrapper, Error> {
    let replace = Replace::new(" ", "▁").map_err(|e| Error::Tokenizer(e.to_string()))?;
    Ok(replace.into())
}

/// Gemma 4's pre-tokenizer: runs of newlines apart from the rest, as
/// llama.cpp splits its text (`[^\n]+|[\n]+`) before the merges.
pub(crate) fn gemma4_pre_tokenizer() -> Result<PreTokenizerWrapper, Error> {
    let split = Split::new(
        SplitPattern::Regex("\n+".into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| Error::Tokenizer(e.to_string()))?;
    Ok(split.into())
}

/// Gemma 4's decoder: `▁` to space, bytes to text.
pub(crate) fn gemma4_decoder() -> Result<DecoderWrapper, Error> {
    let replace = Replace::new("▁", " ").map_err(|e| Error::Tokenizer(e.to_string()))?;
    Ok(DecoderSequence::new(vec![
        replace.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ])
    .into())
}

/// SentencePiece's decoder: `▁` to space, bytes to text, drop the prefix space.
pub(crate) fn llama_decoder() -> Result<DecoderWrapper, Error> {
    let replace = Replace::new("▁", " ").map_err(|e| Error::Tokenizer(e.to_string()))?;
    Ok(DecoderSequence::new(vec![
        replace.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
        Strip::new(' ', 1, 0).into(),
    ])
    .into())
}
