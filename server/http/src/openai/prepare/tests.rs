//! Every field an endpoint parses changes what is submitted, or is refused
//! by value with an error that names it; the table must cover the lists.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::*;
use crate::fixtures::{EOS, FakeFrontend};
use crate::openai::fields::{CHAT_FIELDS, COMMON_FIELDS, COMPLETION_FIELDS, parse};

fn config() -> PrepareConfig {
    PrepareConfig {
        model_name: "fake".into(),
        max_model_len: 128,
        default_max_tokens: 5,
        max_queue: 8,
        tools: crate::tools::parser::ToolSetup {
            family: Some(crate::tools::parser::ToolFamily::Hermes),
            describe: false,
        },
        reasoning: Some(crate::reasoning::choice::ReasoningFamily::Think {
            open: false,
            tags: crate::reasoning::choice::THINK,
        }),
        adapters: None,
    }
}

/// Everything a field can change about a prepared request.
fn fingerprint(p: &Prepared) -> String {
    let r = &p.jobs[0].req;
    format!(
        "{:?} {} {:?} {:?} {} {} {:?} {:?} {} {} {:?} {} {:?} {} {}",
        r.prompt,
        r.max_tokens,
        r.sampling,
        r.stop,
        r.include_stop_str,
        r.min_tokens,
        r.cache_salt,
        r.stop_token_ids,
        r.ignore_eos,
        p.n,
        p.shape,
        r.constraint.is_some(),
        p.jobs[0].echo,
        p.jobs.len(),
        // What the request's detokenizer makes of the end token.
        r.text.fresh().push(EOS),
    )
}

fn merged(base: &Value, over: &Value) -> Vec<u8> {
    let mut m = base.as_object().cloned().unwrap_or_default();
    m.extend(over.as_object().cloned().unwrap_or_default());
    serde_json::to_vec(&Value::Object(m)).unwrap()
}

fn prepare(chat_endpoint: bool, body: &[u8]) -> Result<Prepared, ApiError> {
    if chat_endpoint {
        chat(parse(body, &CHAT_FIELDS)?, &FakeFrontend, &config())
    } else {
        completion(parse(body, &COMPLETION_FIELDS)?, &FakeFrontend, &config())
    }
}

/// What setting a field does.
enum Expect {
    /// The prepared request differs from the one without it.
    Changes,
    /// This value is refused; the message contains the fragment.
    Refused(&'static str),
}

/// (endpoint is chat, field, fields set, what the result is compared with
/// beyond the base, expectation)
type Case = (bool, &'static str, Value, Value, Expect);

fn cases() -> Vec<Case> {
    use Expect::{Changes, Refused};
    let none = json!({});
    let mut out: Vec<Case> = Vec::new();
    for chat in [false, true] {
        let logprobs = if chat { json!(true) } else { json!(2) };
        let common: Vec<(&str, Value, Value, Expect)> = vec![
            (
                "model",
                json!({"model": "other"}),
                none.clone(),
                Refused("does not exist"),
            ),
            (
                "max_tokens",
                json!({"max_tokens": 3}),
                none.clone(),
                Changes,
            ),
            (
                "temperature",
                json!({"temperature": 0.5}),
                none.clone(),
                Changes,
            ),
            ("top_p", json!({"top_p": 0.5}), none.clone(), Changes),
            ("n", json!({"n": 2}), none.clone(), Changes),
            ("stream", json!({"stream": true}), none.clone(), Changes),
            (
                "stream_options",
                json!({"stream": true, "stream_options": {"include_usage": true}}),
                json!({"stream": true}),
                Changes,
            ),
            ("stop", json!({"stop": "x"}), none.clone(), Changes),
            (
                "presence_penalty",
                json!({"presence_penalty": 0.5}),
                none.clone(),
                Changes,
            ),
            (
                "frequency_penalty",
                json!({"frequency_penalty": 0.5}),
                none.clone(),
                Changes,
            ),
            ("seed", json!({"seed": 2}), none.clone(), Changes),
            (
                "logit_bias",
                json!({"logit_bias": {"1": 5}}),
                none.clone(),
                Changes,
            ),
            (
                "ignore_eos",
                json!({"ignore_eos": true}),
                none.clone(),
                Changes,
            ),
            (
                "disable_spec_decode",
                json!({"disable_spec_decode": true}),
                none.clone(),
                Changes,
            ),
            ("top_k", json!({"top_k": 2}), none.clone(), Changes),
            ("min_p", json!({"min_p": 0.1}), none.clone(), Changes),
            (
                "repetition_penalty",
                json!({"repetition_penalty": 1.1}),
                none.clone(),
                Changes,
            ),
            (
                "stop_token_ids",
                json!({"stop_token_ids": [7]}),
                none.clone(),
                Changes,
            ),
            (
                "logprobs",
                json!({"logprobs": logprobs}),
                none.clone(),
                Changes,
            ),
            (
                "skip_special_tokens",
                json!({"skip_special_tokens": false}),
                none.clone(),
                Changes,
            ),
            (
                "priority",
                json!({"priority": 1}),
                none.clone(),
                Refused("only 0 is accepted"),
            ),
            (
                "request_id",
                json!({"request_id": "r-1"}),
                none.clone(),
                Changes,
            ),
            (
                "min_tokens",
                json!({"min_tokens": 2, "max_tokens": 4}),
                json!({"max_tokens": 4}),
                Changes,
            ),
            (
                "prompt_logprobs",
                json!({"prompt_logprobs": 2}),
                none.clone(),
                Changes,
            ),
            (
                "return_tokens_as_token_ids",
                json!({"return_tokens_as_token_ids": true}),
                none.clone(),
                Changes,
            ),
            (
                "allowed_token_ids",
                json!({"allowed_token_ids": [3]}),
                none.clone(),
                Changes,
            ),
            (
                "bad_words",
                json!({"bad_words": ["x"]}),
                none.clone(),
                Changes,
            ),
            (
                "truncate_prompt_tokens",
                json!({"truncate_prompt_tokens": 1}),
                none.clone(),
                Changes,
            ),
            (
                "cache_salt",
                json!({"cache_salt": "tenant-1"}),
                none.clone(),
                Changes,
            ),
            (
                "include_stop_str_in_output",
                json!({"stop": "x", "include_stop_str_in_output": true}),
                json!({"stop": "x"}),
                Changes,
            ),
            (
                "response_format",
                json!({"response_format": {"type": "json_object"}}),
                none.clone(),
                Changes,
            ),
            (
                "guided_json",
                json!({"guided_json": {"type": "integer"}}),
                none.clone(),
                Changes,
            ),
            (
                "guided_regex",
                json!({"guided_regex": "[0-9]+"}),
                none.clone(),
                Changes,
            ),
            (
                "guided_choice",
                json!({"guided_choice": ["yes", "no"]}),
                none.clone(),
                Changes,
            ),
            (
                "guided_grammar",
                json!({"guided_grammar": "start: \"yes\""}),
                none.clone(),
                Changes,
            ),
            (
                "structured_outputs",
                json!({"structured_outputs": {"json": {"type": "object"}}}),
                none.clone(),
                Changes,
            ),
        ];
        out.extend(
            common
                .into_iter()
                .map(|(f, set, against, e)| (chat, f, set, against, e)),
        );
    }
    let completion: Vec<(&str, Value, Value, Expect)> = vec![
        ("prompt", json!({"prompt": "cd"}), none.clone(), Changes),
        ("echo", json!({"echo": true}), none.clone(), Changes),
        (
            "best_of",
            json!({"best_of": 2}),
            none.clone(),
            Refused("best_of"),
        ),
        (
            "suffix",
            json!({"suffix": "x"}),
            none.clone(),
            Refused("suffix"),
        ),
    ];
    out.extend(
        completion
            .into_iter()
            .map(|(f, s, a, e)| (false, f, s, a, e)),
    );
    let tool = json!([{"type": "function", "function": {"name": "f"}}]);
    let chat: Vec<(&str, Value, Value, Expect)> = vec![
        (
            "messages",
            json!({"messages": [{"role": "user", "content": "cd"}]}),
            none.clone(),
            Changes,
        ),
        (
            "max_completion_tokens",
            json!({"max_completion_tokens": 3}),
            none.clone(),
            Changes,
        ),
        (
            "top_logprobs",
            json!({"logprobs": true, "top_logprobs": 2}),
            json!({"logprobs": true}),
            Changes,
        ),
        (
            "tools",
            json!({"tools": tool, "tool_choice": "none"}),
            json!({"tool_choice": "none"}),
            Changes,
        ),
        (
            "tool_choice",
            json!({"tools": tool, "tool_choice": "auto"}),
            json!({"tools": tool, "tool_choice": "none"}),
            Changes,
        ),
        (
            "parallel_tool_calls",
            json!({"tools": tool, "parallel_tool_calls": false}),
            json!({"tools": tool}),
            Changes,
        ),
        (
            "add_generation_prompt",
            json!({"add_generation_prompt": false}),
            none.clone(),
            Changes,
        ),
        (
            "continue_final_message",
            json!({"continue_final_message": true, "add_generation_prompt": true}),
            none.clone(),
            Refused("cannot both be true"),
        ),
        (
            "chat_template_kwargs",
            json!({"chat_template_kwargs": {"enable_thinking": false}}),
            none.clone(),
            Changes,
        ),
        (
            "reasoning_effort",
            json!({"reasoning_effort": "low"}),
            none.clone(),
            Changes,
        ),
        (
            "include_reasoning",
            json!({"include_reasoning": false}),
            none.clone(),
            Changes,
        ),
        (
            "verbosity",
            json!({"verbosity": "low"}),
            none.clone(),
            Changes,
        ),
        (
            "echo",
            json!({"echo": true, "messages": [
                {"role": "user", "content": "ab"}, {"role": "assistant", "content": "c"}]}),
            json!({"messages": [
                {"role": "user", "content": "ab"}, {"role": "assistant", "content": "c"}]}),
            Changes,
        ),
    ];
    out.extend(chat.into_iter().map(|(f, s, a, e)| (true, f, s, a, e)));
    out
}

#[test]
fn every_parsed_field_changes_the_request_or_is_refused_by_value() {
    let completion_base = json!({"prompt": "ab", "seed": 1});
    let chat_base = json!({"messages": [{"role": "user", "content": "ab"}], "seed": 1});
    let mut covered = [BTreeSet::new(), BTreeSet::new()];
    for (is_chat, field, set, against, expect) in cases() {
        let base = if is_chat {
            &chat_base
        } else {
            &completion_base
        };
        covered[usize::from(is_chat)].insert(field);
        let got = prepare(is_chat, &merged(base, &set));
        match expect {
            Expect::Changes => {
                let before = prepare(is_chat, &merged(base, &against)).unwrap();
                let after = got.unwrap_or_else(|e| panic!("{field}: {e}"));
                assert_ne!(
                    fingerprint(&before),
                    fingerprint(&after),
                    "{field} changed nothing"
                );
            }
            Expect::Refused(w) => {
                let e = got.err().unwrap_or_else(|| panic!("{field}: accepted"));
                assert!(e.to_string().contains(w), "{field}: {e}");
            }
        }
    }
    let want = |extra: &[&'static str]| -> BTreeSet<&'static str> {
        COMMON_FIELDS.iter().chain(extra).copied().collect()
    };
    assert_eq!(
        covered[0],
        want(&COMPLETION_FIELDS),
        "completion fields without a case"
    );
    assert_eq!(covered[1], want(&CHAT_FIELDS), "chat fields without a case");
}

#[test]
fn a_grammar_that_does_not_compile_is_a_400_naming_its_field() {
    // (endpoint is chat, fields, field named)
    let cases = [
        (
            true,
            json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}}}),
            "response_format",
        ),
        (
            false,
            json!({"guided_json": {"type": "string", "pattern": "(a"}}),
            "guided_json",
        ),
        (
            false,
            json!({"guided_grammar": "start: missing"}),
            "guided_grammar",
        ),
    ];
    for (is_chat, fields, field) in cases {
        let base = if is_chat {
            json!({"messages": [{"role": "user", "content": "ab"}]})
        } else {
            json!({"prompt": "ab"})
        };
        match prepare(is_chat, &merged(&base, &fields)) {
            Err(ApiError::Invalid { message, param }) => {
                assert_eq!(param.as_deref(), Some(field), "{fields}");
                assert!(message.starts_with(field), "{message}");
            }
            Err(e) => panic!("{fields}: {e}"),
            Ok(_) => panic!("{fields}: accepted"),
        }
    }
}

#[test]
fn each_choice_gets_its_own_constraint() {
    let body = json!({"prompt": "ab", "n": 3, "response_format": {"type": "json_object"}});
    let p = prepare(false, &serde_json::to_vec(&body).unwrap()).unwrap();
    let (reqs, _) = p.requests();
    assert_eq!(reqs.len(), 3);
    assert!(reqs.iter().all(|(r, _)| r.constraint.is_some()));
}

#[test]
fn a_prompt_batch_gets_n_choices_per_prompt_in_order() {
    let body = json!({"prompt": ["ab", "c", "abc"], "n": 2, "echo": true, "seed": 7});
    let p = prepare(false, &serde_json::to_vec(&body).unwrap()).unwrap();
    let (reqs, _) = p.requests();
    let got: Vec<_> = reqs
        .iter()
        .map(|(r, m)| {
            let echo = m.echo.as_ref().map(|e| e.text.as_str());
            (r.prompt.len(), r.sampling.seed, echo, m.counts_prompt)
        })
        .collect();
    let want = [
        (2, 7, Some("ab"), true),
        (2, 8, Some("ab"), false),
        (1, 7, Some("c"), true),
        (1, 8, Some("c"), false),
        (3, 7, Some("abc"), true),
        (3, 8, Some("abc"), false),
    ];
    assert_eq!(got, want);
    let too_many = json!({"prompt": ["a", "b", "c"], "n": 3});
    let err = prepare(false, &serde_json::to_vec(&too_many).unwrap())
        .err()
        .unwrap();
    assert!(err.to_string().contains("3 prompts x n = 3"), "{err}");
}
