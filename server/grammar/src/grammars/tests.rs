//! Schemas compile into masks that accept what validates and nothing else;
//! what llguidance cannot do is refused at compile, never at sampling.

use std::time::{Duration, Instant};

use ferrox_engine::TokenConstraint;
use serde_json::{Value, json};

use crate::fixtures::{accepts, compile, feed, grammars, may_end};
use crate::{GrammarError, GrammarSpec, Grammars, Vocab};

fn schema(v: Value) -> GrammarSpec {
    GrammarSpec::JsonSchema(v)
}

#[test]
fn large_bounds_compile_lazily_and_stay_cheap() {
    // Repetition bounds are not unrolled: these compile (and mask) at once.
    for s in [
        json!({"type": "string", "pattern": "a{100000}"}),
        json!({"type": "string", "minLength": 10_000_000}),
        json!({"type": "array", "minItems": 1_000_000_000u64}),
    ] {
        let mut m = grammars().compile(&schema(s.clone())).unwrap();
        let first = if s["type"] == "array" { "[" } else { "\"" };
        feed(&mut m, first).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert!(!may_end(&mut m));
    }
}

#[test]
fn each_schema_accepts_its_valid_outputs_and_refuses_the_rest() {
    let person = json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": false,
    });
    let nested = json!({
        "type": "object",
        "properties": {
            "user": {"type": "object", "properties": {"id": {"type": "integer"}},
                     "required": ["id"], "additionalProperties": false},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["user", "tags"],
        "additionalProperties": false,
    });
    // Pydantic's shape: a model under $defs, referenced.
    let refs = json!({
        "$defs": {"Color": {"enum": ["red", "green"], "type": "string"}},
        "properties": {"color": {"$ref": "#/$defs/Color"}},
        "required": ["color"],
        "type": "object",
    });
    // (spec, accepted, refused)
    let cases: Vec<(GrammarSpec, Vec<&str>, Vec<&str>)> = vec![
        (
            schema(person),
            vec![
                r#"{"name": "ann", "age": 30}"#,
                r#"{"name": "", "age": -1}"#,
            ],
            vec![
                r#"{"name": 5"#,
                r#"{"name": "a"}"#,
                r#"{"name": "a", "age": 1.5}"#,
                r#"{"name": "a", "age": 1, "x""#,
                r#"[1]"#,
            ],
        ),
        (
            schema(json!({"type": "string", "enum": ["red", "green"]})),
            vec![r#""red""#, r#""green""#],
            vec![r#""blue""#, r#""re""#, "red"],
        ),
        (
            schema(json!({"enum": [1, "two", null]})),
            vec!["1", r#""two""#, "null"],
            vec!["2", "true"],
        ),
        (
            schema(json!({"type": "array", "items": {"type": "integer"},
                          "minItems": 1, "maxItems": 3})),
            vec!["[1]", "[1, 2, 3]"],
            vec!["[]", "[1, 2, 3, 4]", r#"["a"]"#],
        ),
        (
            schema(nested),
            vec![
                r#"{"user": {"id": 7}, "tags": ["a", "b"]}"#,
                r#"{"user": {"id": 7}, "tags": []}"#,
            ],
            vec![
                r#"{"user": {"id": "7"}"#,
                r#"{"user": {"id": 7, "x": 1}"#,
                r#"{"user": {}}"#,
            ],
        ),
        (
            schema(refs),
            vec![r#"{"color": "red"}"#],
            vec![r#"{"color": "blue"}"#],
        ),
        (
            GrammarSpec::JsonObject,
            vec![r#"{"a": [1, {"b": null}], "c": "d"}"#, "{}"],
            vec!["[1]", r#""x""#, "1"],
        ),
        (
            GrammarSpec::Lark(r#"start: "yes" | "no""#.into()),
            vec!["yes", "no"],
            vec!["maybe", "ye"],
        ),
        (
            GrammarSpec::Regex("[0-9]{3}-[a-z]+".into()),
            vec!["123-abc", "000-z"],
            vec!["12-abc", "123-", "123-abcX", " 123-abc"],
        ),
        // Choices are literal text, regex metacharacters and all.
        (
            GrammarSpec::choice(&["yes", "no.", "a|b", "(x)"]).unwrap(),
            vec!["yes", "no.", "a|b", "(x)"],
            vec!["no", "noX", "a", "x", "yesno", ""],
        ),
    ];
    for (spec, good, bad) in cases {
        for text in good {
            assert!(accepts(&spec, text), "{spec:?} should accept {text}");
        }
        for text in bad {
            assert!(!accepts(&spec, text), "{spec:?} should refuse {text}");
        }
    }
}

#[test]
fn nothing_to_choose_is_no_grammar() {
    assert_eq!(GrammarSpec::choice::<&str>(&[]), None);
}

#[test]
fn a_complete_object_finishes_the_row_and_the_end_token_is_allowed_only_then() {
    let mut m = compile(schema(
        json!({"type": "object", "properties": {"a": {"type": "integer"}},
                                     "required": ["a"], "additionalProperties": false}),
    ));
    feed(&mut m, r#"{"a": 1"#).unwrap();
    assert!(!m.is_finished());
    // The number may go on, or the object close; it may not end yet.
    assert!(!may_end(&mut m));
    feed(&mut m, "}").unwrap();
    assert!(m.is_finished(), "nothing can follow the closing brace");
}

#[test]
fn mask_forbids_ids_past_the_grammar_vocabulary_and_multi_byte_words_count() {
    let mut m = compile(GrammarSpec::JsonObject);
    let size = grammars().vocab_size();
    let mut logits = vec![0.0; size + 10];
    m.mask(&mut logits).unwrap();
    let allowed: Vec<usize> = (0..logits.len())
        .filter(|&i| logits[i].is_finite())
        .collect();
    // `{` and the word `{"` (id 257); nothing else opens an object.
    assert_eq!(allowed, vec![usize::from(b'{'), 257]);
    m.advance(257).unwrap();
    feed(&mut m, "a").unwrap();
}

#[test]
fn forks_go_their_own_way() {
    let spec = schema(json!({"enum": ["ab", "cd"]}));
    let mut a = compile(spec);
    feed(&mut a, "\"").unwrap();
    let mut b = a.clone();
    feed(&mut a, "ab\"").unwrap();
    feed(&mut b, "cd\"").unwrap();
    assert!(may_end(&mut a) && may_end(&mut b));
    let mut c = a.fork();
    let mut logits = vec![0.0; 300];
    // `a` is complete; its fork is too, and says so instead of masking.
    assert!(c.is_finished() || c.mask(&mut logits).is_ok());
}

#[test]
fn unsupported_or_hostile_grammars_are_refused_at_compile_with_a_message() {
    let many_props: serde_json::Map<String, Value> = (0..100_000)
        .map(|i| (format!("p{i}"), json!({"type": "integer"})))
        .collect();
    let big_enum: Vec<String> = (0..300_000).map(|i| format!("v{i}")).collect();
    let cases: Vec<(GrammarSpec, &str)> = vec![
        (schema(json!(true)), "must be an object"),
        (schema(json!({"type": "string", "pattern": "(a"})), ""),
        (schema(json!({"type": "frobnicate"})), ""),
        (schema(json!({"$ref": "#/$defs/missing"})), ""),
        (
            schema(json!({"$ref": "https://example.com/schema.json"})),
            "",
        ),
        (
            schema(json!({"type": "string", "minLength": 5, "maxLength": 2})),
            "",
        ),
        (
            schema(json!({"allOf": [{"type": "string"}, {"type": "integer"}]})),
            "",
        ),
        // Past the limits: the grammar's size, the lexer's fuel.
        (
            schema(json!({"type": "object", "properties": many_props})),
            "too large",
        ),
        (schema(json!({"enum": big_enum})), "too big"),
        (GrammarSpec::Lark("start: missing_rule".into()), ""),
        (GrammarSpec::Lark("start: ((".into()), ""),
        (GrammarSpec::Regex("(a".into()), ""),
    ];
    let g = grammars();
    for (spec, fragment) in cases {
        let started = Instant::now();
        let got = g.compile(&spec);
        // Not a speed check: a hang detector with a wide margin.
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{spec:?} ran long"
        );
        match got {
            Err(GrammarError::Compile(msg)) => {
                assert!(!msg.is_empty() && msg.contains(fragment), "{spec:?}: {msg}")
            }
            other => panic!("{spec:?} should be refused, got {other:?}"),
        }
    }
}

#[test]
fn a_vocabulary_it_cannot_use_is_refused_at_start() {
    let mut no_eos = crate::fixtures::vocab();
    no_eos.eos.clear();
    let mut eos_outside = crate::fixtures::vocab();
    eos_outside.eos = vec![10_000];
    let mut special_outside = crate::fixtures::vocab();
    special_outside.special.push((10_000, "<x>".into()));
    for v in [no_eos, eos_outside, special_outside, Vocab::default()] {
        assert!(
            matches!(Grammars::new(v.clone()), Err(GrammarError::Vocabulary(_))),
            "{v:?}"
        );
    }
}

#[test]
fn the_real_vocabulary_spells_text_and_its_tokenization_of_valid_json_is_allowed() {
    let Some((text, vocab)) = crate::fixtures::smollm2() else {
        return;
    };
    let out = r#"{"name": "Ann Lee", "tags": ["ab", "x"], "n": 12}"#;
    let ids = text.tokenizer.encode(out, false).unwrap();
    let spelled: Vec<u8> = ids
        .iter()
        .flat_map(|&i| vocab.tokens[i as usize].clone())
        .collect();
    assert_eq!(String::from_utf8(spelled).unwrap(), out);
    let eos = vocab.eos.clone();
    assert!(!eos.is_empty());
    let g = Grammars::new(vocab).unwrap();
    let mut m = g
        .compile(&schema(json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "tags": {"type": "array",
                "items": {"type": "string"}}, "n": {"type": "integer"}},
            "required": ["name", "tags", "n"],
            "additionalProperties": false,
        })))
        .unwrap();
    for &id in &ids {
        let allowed = m.allowed().unwrap();
        assert!(
            allowed.is_allowed(id),
            "token {id} of the valid output masked"
        );
        assert!(!allowed.is_allowed(eos[0]), "the end token before the end");
        m.advance(id).unwrap();
    }
    assert!(m.is_finished());
}
