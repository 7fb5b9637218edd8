//! The set of token ids that end a model's turn.

use crate::gguf_vocab::GgufVocab;
use crate::tokenizer::Tokenizer;

/// End-of-turn markers looked up by text, for vocabularies whose metadata
/// names only some of them (ChatML, Llama 3, Gemma, GPT-2, and harmony's
/// `<|return|>` and `<|call|>`: gpt-oss's config names one of the three;
/// Gemma 4's `<turn|>`, Llama 4's `<|eot|>`, and GLM-4.5's `<|user|>` and
/// `<|observation|>`, which its generation config lists beside its eos).
const END_TEXTS: [&str; 11] = [
    "<|im_end|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|return|>",
    "<|call|>",
    "<turn|>",
    "<|eot|>",
    "<|user|>",
    "<|observation|>",
];

/// The model's own ends of generation (not the caller's stop tokens).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndOfGeneration {
    ids: Vec<u32>,
}

impl EndOfGeneration {
    /// The given metadata ids plus every known end marker the vocabulary has.
    pub fn new(tokenizer: &Tokenizer, metadata_ids: &[Option<u32>]) -> Self {
        let by_text = END_TEXTS.iter().filter_map(|t| tokenizer.token_to_id(t));
        let mut ids: Vec<u32> = metadata_ids
            .iter()
            .flatten()
            .copied()
            .chain(by_text)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        Self { ids }
    }

    /// The end set of a GGUF model: its eos, eot and eom ids plus the markers.
    pub fn from_gguf(tokenizer: &Tokenizer, vocab: &GgufVocab) -> Self {
        Self::new(tokenizer, &[vocab.eos_id, vocab.eot_id, vocab.eom_id])
    }

    /// Whether `id` ends generation.
    pub fn contains(&self, id: u32) -> bool {
        self.ids.binary_search(&id).is_ok()
    }

    /// The ids, sorted and without duplicates.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::tests::{tiny_gpt2, tiny_llama};

    #[test]
    fn metadata_ids_and_known_texts() {
        let gpt2 = tiny_gpt2();
        let tok = Tokenizer::from_gguf(&gpt2).unwrap();
        // eos (17) is also "<|endoftext|>": counted once.
        let eog = EndOfGeneration::from_gguf(&tok, &gpt2);
        assert_eq!(eog.ids(), &[17]);
        assert!(eog.contains(17) && !eog.contains(16));

        let mut llama = tiny_llama();
        llama.eot_id = Some(5);
        let tok = Tokenizer::from_gguf(&llama).unwrap();
        let eog = EndOfGeneration::from_gguf(&tok, &llama);
        assert_eq!(eog.ids(), &[2, 5]);
        assert_eq!(EndOfGeneration::new(&tok, &[None]).ids(), &[] as &[u32]);
    }

    #[test]
    fn the_new_families_turn_ends_are_known_by_text() {
        // Gemma 4's, Llama 4's and GLM-4.5's, as control tokens after a
        // Llama vocabulary (whose own start is not an end).
        let mut vocab = tiny_llama();
        let ends = ["<turn|>", "<|eot|>", "<|user|>", "<|observation|>"];
        let first = vocab.tokens.len() as u32;
        for t in ["<|turn>"].iter().chain(&ends) {
            vocab.tokens.push(t.to_string());
            vocab.token_types.as_mut().unwrap().push(3);
            vocab.scores.as_mut().unwrap().push(0.0);
        }
        let tok = Tokenizer::from_gguf(&vocab).unwrap();
        let eog = EndOfGeneration::new(&tok, &[None]);
        assert_eq!(eog.ids(), &[first + 1, first + 2, first + 3, first + 4]);
    }
}
