//! The default model's GGUF vocabulary against reference ids.
//!
//! Reference ids were produced once, independently of this crate, with Python:
//! the `gguf` package (0.19) read the file's metadata, and transformers 5.24's own
//! GGUF tokenizer conversion (`transformers.integrations.gguf.gguf_tokenizer_mapping`:
//! `get_gguf_tokenizer` + `convert_gguf_tokenizer`, wrapped in
//! `PreTrainedTokenizerFast`, tokenizers 0.23.3) encoded the texts with
//! `add_special_tokens=False` and rendered the chat with `apply_chat_template`.
//! (transformers' torch-based metadata reader was swapped for the `gguf` package
//! because torch is not installed; the tokenizer conversion is transformers' own.)

mod common;

use ferrox_core::{ChatMessage, ChatTemplate, Detokenizer, EndOfGeneration, Tokenizer};

const CAPITALS: &str =
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is";
const CAPITALS_IDS: [u32; 19] = [
    504, 3575, 282, 4649, 314, 7042, 30, 378, 3575, 282, 4521, 314, 11452, 30, 378, 3575, 282,
    7158, 314,
];
const CHAT_TEXT: &str = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
const CHAT_IDS: [u32; 31] = [
    1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407,
    19712, 8182, 2, 198, 1, 4093, 198, 26843, 2, 198, 1, 520, 9531, 198,
];
const REFERENCE: [(&str, &[u32]); 6] = [
    (CAPITALS, &CAPITALS_IDS),
    (
        "naïve café — 東京 🚀 ü",
        &[
            3546, 46494, 37366, 1841, 17097, 247, 126, 16736, 122, 15107, 244, 218, 5549, 137,
        ],
    ),
    (
        "Hello world!\n\n  x = 12345;\tdone",
        &[
            19556, 905, 17, 8866, 1792, 446, 216, 33, 34, 35, 36, 37, 43, 197, 22744,
        ],
    ),
    (
        "<|im_start|>user\nHi<|im_end|>\n",
        &[1, 4093, 198, 26843, 2, 198],
    ),
    (
        "In 2024, 1,000,000 people said: don't!",
        &[
            788, 216, 34, 32, 34, 36, 28, 216, 33, 28, 32, 32, 32, 28, 32, 32, 32, 701, 1137, 42,
            1326, 982, 17,
        ],
    ),
    (
        "  two  spaces\n\n\nend<|endoftext|>",
        &[216, 827, 216, 5600, 1116, 198, 486, 0],
    ),
];

fn load() -> Option<(Tokenizer, ferrox_core::GgufVocab, String)> {
    let md = common::model_metadata()?;
    let vocab = common::vocab(&md);
    let template = md["tokenizer.chat_template"]
        .as_str()
        .expect("template")
        .to_string();
    Some((
        Tokenizer::from_gguf(&vocab).expect("tokenizer"),
        vocab,
        template,
    ))
}

#[test]
fn encodes_like_the_reference_and_round_trips() {
    let Some((tok, vocab, _)) = load() else {
        return;
    };
    assert_eq!(vocab.pre.as_deref(), Some("smollm"));
    assert_eq!(tok.vocab_size(), 49152);
    // This model's GGUF says add_bos = false: add_special_tokens adds nothing.
    assert_eq!(vocab.add_bos, Some(false));
    assert_eq!(tok.encode(CAPITALS, true).unwrap(), CAPITALS_IDS);
    for (text, want) in REFERENCE {
        assert_eq!(tok.encode(text, false).unwrap(), want, "{text:?}");
        assert_eq!(tok.decode(want, false).unwrap(), text, "{text:?}");
    }
    assert_eq!(tok.bos_token(), Some("<|im_start|>"));
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    assert_eq!(
        tok.decode(&[1, 4093, 198, 26843, 2], true).unwrap(),
        "user\nHi"
    );
}

#[test]
fn chat_template_renders_and_tokenizes_like_the_reference() {
    let Some((tok, _, source)) = load() else {
        return;
    };
    let bos = tok.bos_token().map(str::to_string);
    let eos = tok.eos_token().map(str::to_string);
    let template = ChatTemplate::new(source, bos, eos).unwrap();
    let text = template
        .render(&[ChatMessage::new("user", "Hi")], true)
        .unwrap();
    assert_eq!(text, CHAT_TEXT);
    assert_eq!(tok.encode(&text, false).unwrap(), CHAT_IDS);
}

#[test]
fn streaming_never_splits_a_character() {
    let Some((tok, _, _)) = load() else { return };
    let (text, ids) = REFERENCE[1];
    let mut detok = Detokenizer::new(false);
    let pieces: Vec<String> = ids
        .iter()
        .map(|&id| detok.push(&tok, id).unwrap())
        .collect();
    assert_eq!(detok.finish(&tok).unwrap(), "");
    assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
    // 東, 京 and 🚀 span several byte-level tokens, so some pushes yield nothing.
    assert!(
        pieces.iter().filter(|p| p.is_empty()).count() >= 3,
        "{pieces:?}"
    );
    assert_eq!(pieces.concat(), text);
}

#[test]
fn end_set_has_im_end_and_endoftext() {
    let Some((tok, vocab, _)) = load() else {
        return;
    };
    let eog = EndOfGeneration::from_gguf(&tok, &vocab);
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    let endoftext = tok.token_to_id("<|endoftext|>").unwrap();
    assert!(
        eog.contains(im_end) && eog.contains(endoftext),
        "{:?}",
        eog.ids()
    );
    assert!(!eog.contains(tok.token_to_id("<|im_start|>").unwrap()));
}

#[test]
fn the_tokenizer_written_down_and_rebuilt_encodes_alike() {
    let Some((tok, _, _)) = load() else { return };
    // What a router rebuilds from the server's /prefix_spec.
    let json = serde_json::to_string(&tok.to_spec().unwrap()).unwrap();
    let back = Tokenizer::from_spec(&serde_json::from_str(&json).unwrap()).unwrap();
    for (text, want) in REFERENCE
        .iter()
        .copied()
        .chain([(CHAT_TEXT, &CHAT_IDS[..])])
    {
        assert_eq!(back.encode(text, false).unwrap(), want, "{text:?}");
    }
    assert_eq!(back.encode(CAPITALS, true).unwrap(), CAPITALS_IDS);
    assert_eq!(
        (back.bos_token(), back.eos_token()),
        (tok.bos_token(), tok.eos_token())
    );
    assert_eq!(back.vocab_size(), tok.vocab_size());
}
