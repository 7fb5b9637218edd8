use super::*;
use crate::gguf_vocab::TOKEN_TYPE_USER_DEFINED;

/// A tiny byte-level vocabulary: "hello world" and a ChatML marker.
pub(crate) fn tiny_gpt2() -> GgufVocab {
    let tokens = [
        "h",
        "e",
        "l",
        "o",
        "Ġ",
        "w",
        "r",
        "d",
        "he",
        "ll",
        "hell",
        "hello",
        "Ġw",
        "or",
        "Ġwor",
        "Ġworld",
        "<|im_start|>",
        "<|endoftext|>",
        "1",
        "2",
        "ld",
    ];
    let merges = [
        "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld",
    ];
    let mut types = vec![1; tokens.len()];
    types[16] = 3;
    types[17] = 3;
    GgufVocab {
        model: "gpt2".into(),
        pre: Some("smollm".into()),
        tokens: tokens.iter().map(|s| s.to_string()).collect(),
        token_types: Some(types),
        merges: Some(merges.iter().map(|s| s.to_string()).collect()),
        bos_id: Some(17),
        eos_id: Some(17),
        add_bos: Some(false),
        ..GgufVocab::default()
    }
}

/// A tiny SentencePiece-style vocabulary with byte fallback.
pub(crate) fn tiny_llama() -> GgufVocab {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0, 0.0, 0.0];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    let pieces = [
        ("▁", -1.0),
        ("h", -2.0),
        ("i", -3.0),
        ("t", -4.0),
        ("e", -5.0),
        ("r", -6.0),
        ("hi", -1.5),
        ("▁hi", -1.2),
        ("er", -7.0),
        ("th", -8.0),
        ("▁th", -9.0),
        ("▁the", -2.5),
        ("the", -9.5),
        ("é", -10.0),
    ];
    for (p, s) in pieces {
        tokens.push(p.to_string());
        types.push(1);
        scores.push(s);
    }
    GgufVocab {
        model: "llama".into(),
        tokens,
        scores: Some(scores),
        token_types: Some(types),
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: Some(0),
        ..GgufVocab::default()
    }
}

#[test]
fn tiny_gpt2_encodes_merges_specials_and_digits() {
    let tok = Tokenizer::from_gguf(&tiny_gpt2()).unwrap();
    let cases: &[(&str, &[u32])] = &[
        ("hello world", &[11, 15]),
        ("<|im_start|>hello", &[16, 11]),
        ("12", &[18, 19]),
        ("hello<|endoftext|> world", &[11, 17, 15]),
    ];
    for (text, want) in cases {
        assert_eq!(&tok.encode(text, true).unwrap(), want, "{text:?}");
        assert_eq!(tok.decode(want, false).unwrap(), *text);
    }
    assert_eq!(tok.decode(&[16, 11, 17], true).unwrap(), "hello");
    assert_eq!(tok.bos_token(), Some("<|endoftext|>"));
    assert_eq!(tok.token_to_id("Ġworld"), Some(15));
    assert_eq!(tok.id_to_token(11).as_deref(), Some("hello"));
    assert_eq!(tok.vocab_size(), 21);
}

#[test]
fn tiny_llama_encodes_like_sentencepiece() {
    let tok = Tokenizer::from_gguf(&tiny_llama()).unwrap();
    // Reference ids from transformers 5.24's GGUF llama conversion
    // (`convert_gguf_tokenizer("llama", ...)`) of this same vocabulary.
    // "ü" is not in the vocabulary and falls back to its UTF-8 bytes.
    let cases: &[(&str, &[u32])] = &[
        ("hi the ü", &[266, 270, 259, 198, 191]),
        ("hi 🚀 the", &[266, 259, 243, 162, 157, 131, 270]),
        ("the hi  é", &[270, 266, 259, 259, 272]),
        ("there", &[269, 267, 263]),
        // Where transformers' Metaspace(prepend_scheme=first) differs we
        // follow llama.cpp: a space is prefixed to every text fragment,
        // even after a special token or before an existing space.
        ("<s>hi", &[1, 266]),
        (" hi", &[259, 266]),
    ];
    for (text, want) in cases {
        assert_eq!(&tok.encode(text, false).unwrap(), want, "{text:?}");
    }
    for text in ["hi the ü", "hi 🚀 the", "the hi  é", "there"] {
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text);
    }
    // BOS is added by default for llama vocabularies, and skipped on decode.
    let ids = tok.encode("hi", true).unwrap();
    assert_eq!(ids, vec![1, 266]);
    assert_eq!(tok.decode(&ids, true).unwrap(), "hi");
    assert_eq!(tok.eos_token(), Some("</s>"));
}

/// A tiny vocabulary of llama.cpp's `gemma4` kind: merges over raw
/// text, spaces as `▁` with no prefix, byte fallback.
fn tiny_gemma4() -> GgufVocab {
    let mut tokens: Vec<String> = ["<pad>", "<eos>", "<bos>"].map(String::from).to_vec();
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    let pieces = [
        "▁", "h", "i", "t", "e", "hi", "▁hi", "th", "the", "▁the", "\n", "\n\n",
    ];
    tokens.extend(pieces.map(String::from));
    let merges = ["h i", "▁ hi", "t h", "th e", "▁ the", "\n \n"];
    let mut types = vec![3; 3];
    types.extend([6; 256]);
    types.extend([1; 12]);
    GgufVocab {
        model: "gemma4".into(),
        tokens,
        token_types: Some(types),
        merges: Some(merges.map(String::from).to_vec()),
        bos_id: Some(2),
        eos_id: Some(1),
        add_bos: Some(true),
        ..GgufVocab::default()
    }
}

#[test]
fn tiny_gemma4_merges_raw_text_with_byte_fallback() {
    let tok = Tokenizer::from_gguf(&tiny_gemma4()).unwrap();
    // Ids: the specials 0..2, bytes 3..258, then "▁" 259, "hi" 264,
    // "the" 267, "▁the" 268, "\n\n" 270. No space before the text; "ü"
    // is its UTF-8 bytes; newlines merge apart from the words.
    let cases: &[(&str, &[u32])] = &[
        ("hi the", &[264, 268]),
        ("hi ü", &[264, 259, 3 + 0xC3, 3 + 0xBC]),
        ("hi\n\nthe", &[264, 270, 267]),
    ];
    for (text, want) in cases {
        assert_eq!(&tok.encode(text, false).unwrap(), want, "{text:?}");
        assert_eq!(tok.decode(want, false).unwrap(), *text);
    }
    assert_eq!(tok.encode("hi", true).unwrap(), vec![2, 264]);
    assert_eq!(tok.eos_token(), Some("<eos>"));
}

#[test]
fn user_defined_tokens_match_whole_but_are_not_special() {
    let mut vocab = tiny_gpt2();
    vocab.tokens.push("<think>".into());
    vocab
        .token_types
        .as_mut()
        .unwrap()
        .push(TOKEN_TYPE_USER_DEFINED);
    let tok = Tokenizer::from_gguf(&vocab).unwrap();
    assert_eq!(tok.encode("hello<think>", false).unwrap(), vec![11, 21]);
    // Skipping special tokens drops control tokens only.
    assert_eq!(tok.decode(&[16, 11, 21], true).unwrap(), "hello<think>");
}

#[test]
fn bad_vocabularies_are_clear_errors() {
    let mut unknown_pre = tiny_gpt2();
    unknown_pre.pre = Some("klingon".into());
    let mut unknown_model = tiny_gpt2();
    unknown_model.model = "rwkv".into();
    let mut bad_id = tiny_gpt2();
    bad_id.eos_id = Some(999);
    let mut no_merges = tiny_gpt2();
    no_merges.merges = None;
    let cases = [
        (unknown_pre, "klingon"),
        (unknown_model, "rwkv"),
        (bad_id, "999"),
        (no_merges, "merges"),
    ];
    for (vocab, needle) in cases {
        let err = Tokenizer::from_gguf(&vocab).unwrap_err().to_string();
        assert!(err.contains(needle), "{err}");
    }
    let tok = Tokenizer::from_gguf(&tiny_gpt2()).unwrap();
    assert!(tok.decode(&[5000], false).is_err());
}

#[test]
fn pre_tokenizers_known_by_name() {
    for pre in [
        None,
        Some("gpt2"),
        Some("smollm"),
        Some("llama-bpe"),
        Some("llama3"),
        Some("qwen2"),
        Some("gpt-2"),
        Some("gpt-4o"),
    ] {
        assert!(gguf_vocab::gpt2_pre_tokenizer(pre).is_ok(), "{pre:?}");
    }
}

#[test]
fn gpt_4o_splits_cased_words_and_digits_in_threes() {
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
    let pre = gguf_vocab::gpt2_pre_tokenizer(Some("gpt-4o")).unwrap();
    let mut s = PreTokenizedString::from("HelloWORLD's 12345");
    pre.pre_tokenize(&mut s).unwrap();
    let pieces: Vec<String> = s
        .get_splits(OffsetReferential::Original, OffsetType::Byte)
        .into_iter()
        .map(|(p, _, _)| p.to_string())
        .collect();
    assert_eq!(pieces, ["Hello", "WORLD's", "Ġ", "123", "45"]);
}

#[test]
fn from_file_reads_tokenizer_json_and_reports_missing() {
    let dir = std::env::temp_dir().join(format!("ferrox-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokenizer.json");
    let tok = Tokenizer::from_gguf(&tiny_gpt2()).unwrap();
    tok.inner.save(&path, false).unwrap();
    let loaded = Tokenizer::from_file(&path).unwrap();
    assert_eq!(loaded.encode("hello world", false).unwrap(), vec![11, 15]);
    let err = Tokenizer::from_file(dir.join("missing.json")).unwrap_err();
    assert!(err.to_string().contains("missing.json"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
