use super::answer::{AnswerCollector, AnswerEvent, AnswerStream, WholeAnswer};
use super::choice::{
    GEMMA4, MISTRAL, ReasoningChoice, ReasoningFamily, ReasoningShape, THINK, detect, opens_think,
};
use crate::openai::prepare::ToolShape;
use crate::tools::parser::event::ToolEvent;
use crate::tools::parser::{ParsedCall, ToolFamily};

const QWEN3: ReasoningFamily = ReasoningFamily::Think {
    open: false,
    tags: THINK,
};
const R1: ReasoningFamily = ReasoningFamily::Think {
    open: true,
    tags: THINK,
};
const GEMMA: ReasoningFamily = ReasoningFamily::Think {
    open: false,
    tags: GEMMA4,
};
const MAGISTRAL: ReasoningFamily = ReasoningFamily::Think {
    open: false,
    tags: MISTRAL,
};
const HARMONY: ReasoningFamily = ReasoningFamily::Harmony;

fn shape(family: ReasoningFamily) -> Option<ReasoningShape> {
    Some(ReasoningShape {
        family,
        open: false,
        include: true,
    })
}

/// The streamed events of `pieces` folded into a whole answer.
fn streamed(
    reasoning: Option<ReasoningShape>,
    tools: Option<ToolShape>,
    pieces: &[&str],
) -> WholeAnswer {
    let mut s = AnswerStream::new(reasoning, tools);
    let mut events = Vec::new();
    for p in pieces {
        events.extend(s.push(p, 1));
    }
    events.extend(s.finish());
    let mut out = WholeAnswer {
        reasoning_tokens: s.reasoning_tokens(),
        ..WholeAnswer::default()
    };
    for e in events {
        match e {
            AnswerEvent::Reasoning(t) => out.reasoning.get_or_insert_default().push_str(&t),
            AnswerEvent::Tool(ToolEvent::Content(t)) => out.content.push_str(&t),
            AnswerEvent::Tool(ToolEvent::Start { index, name }) => {
                assert_eq!(index, out.calls.len());
                out.calls.push(ParsedCall {
                    name,
                    arguments: String::new(),
                });
            }
            AnswerEvent::Tool(ToolEvent::Arguments { index, fragment }) => {
                out.calls[index].arguments.push_str(&fragment);
            }
        }
    }
    assert_eq!(s.calls(), out.calls.len());
    out
}

fn whole(
    reasoning: Option<ReasoningShape>,
    tools: Option<ToolShape>,
    pieces: &[&str],
) -> WholeAnswer {
    let mut c = AnswerCollector::new(reasoning, tools, "");
    for p in pieces {
        c.push(p, 1);
    }
    c.finish()
}

/// Every way of cutting `text`: whole, one char at a time, and at every
/// single point.
fn cuts(text: &str) -> Vec<Vec<&str>> {
    let mut out = vec![vec![text]];
    let bounds: Vec<usize> = (1..text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect();
    let mut chars = Vec::new();
    let mut at = 0;
    for &b in bounds.iter().chain([text.len()].iter()) {
        chars.push(&text[at..b]);
        at = b;
    }
    out.push(chars);
    for &b in &bounds {
        out.push(vec![&text[..b], &text[b..]]);
    }
    out
}

fn call(name: &str, arguments: &str) -> ParsedCall {
    ParsedCall {
        name: name.into(),
        arguments: arguments.into(),
    }
}

/// (family, tools, output, reasoning, content, calls)
type SplitCase = (
    ReasoningFamily,
    Option<ToolShape>,
    &'static str,
    Option<&'static str>,
    &'static str,
    Vec<ParsedCall>,
);

#[test]
fn split_the_same_however_the_text_is_cut() {
    let hermes = Some(ToolShape {
        family: ToolFamily::Hermes,
        parallel: true,
    });
    // (family, tools, output, reasoning, content, calls)
    let cases: Vec<SplitCase> = vec![
        (
            QWEN3,
            None,
            "<think>\nWhy not.\n</think>\n\nBlue.",
            Some("Why not."),
            "Blue.",
            vec![],
        ),
        (
            QWEN3,
            None,
            "  Plain answer <think> in text",
            None,
            "  Plain answer <think> in text",
            vec![],
        ),
        (QWEN3, None, "<thin", None, "<thin", vec![]),
        // Gemma 4's thought channel and Mistral's [THINK], from the model.
        (
            GEMMA,
            None,
            "<|channel>thought\nThe user wants blue.<channel|>Blue.",
            Some("The user wants blue."),
            "Blue.",
            vec![],
        ),
        (
            MAGISTRAL,
            None,
            "[THINK]Blue, surely.[/THINK]\n\nBlue.",
            Some("Blue, surely."),
            "Blue.",
            vec![],
        ),
        (
            MAGISTRAL,
            None,
            "No [THINK] here.",
            None,
            "No [THINK] here.",
            vec![],
        ),
        (
            QWEN3,
            None,
            "<think>cut off mid thought ",
            Some("cut off mid thought"),
            "",
            vec![],
        ),
        (QWEN3, None, "<think>\n\n</think>\n\nHi", None, "Hi", vec![]),
        (
            QWEN3,
            None,
            "<think>a < b</thi</think>x</think>",
            Some("a < b</thi"),
            "x</think>",
            vec![],
        ),
        (
            R1,
            None,
            "Because.</think>Answer",
            Some("Because."),
            "Answer",
            vec![],
        ),
        (
            R1,
            None,
            "<think>Because.</think>Answer",
            Some("Because."),
            "Answer",
            vec![],
        ),
        (R1, None, "never closed", Some("never closed"), "", vec![]),
        (
            QWEN3,
            hermes,
            "<think>call it</think>\n<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>",
            Some("call it"),
            "",
            vec![call("f", "{\"x\": 1}")],
        ),
        (
            // A call's markup inside the reasoning is not a call.
            QWEN3,
            hermes,
            "<think><tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call></think>ok",
            Some("<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>"),
            "ok",
            vec![],
        ),
        (
            HARMONY,
            None,
            "<|channel|>analysis<|message|>User asks 2+2.<|end|><|start|>assistant<|channel|>final<|message|>4",
            Some("User asks 2+2."),
            "4",
            vec![],
        ),
        (
            HARMONY,
            None,
            "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>",
            Some("Think."),
            "Done.",
            vec![],
        ),
        (
            HARMONY,
            hermes,
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|>",
            Some("Need weather."),
            "",
            vec![call("get_weather", "{\"city\": \"Oslo\"}")],
        ),
        (
            // The recipient before the channel, as the template writes past calls.
            HARMONY,
            hermes,
            "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}<|call|>",
            None,
            "",
            vec![call("f", "{}")],
        ),
        (
            // No tools offered: a call's text is the answer's.
            HARMONY,
            None,
            "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>",
            None,
            "{}",
            vec![],
        ),
        (
            // Plain text (a grammar held the output): the answer.
            HARMONY,
            None,
            "{\"a\": 1}",
            None,
            "{\"a\": 1}",
            vec![],
        ),
        (
            // A preamble on commentary is the answer's; a built-in tool's
            // message is reasoning.
            HARMONY,
            None,
            "<|channel|>commentary<|message|>Looking.<|end|><|start|>assistant<|channel|>analysis to=browser.search<|message|>{}<|end|>",
            Some("{}"),
            "Looking.",
            vec![],
        ),
    ];
    for (family, tools, text, reasoning, content, calls) in cases {
        let want = (reasoning.map(String::from), content.to_string(), calls);
        for pieces in cuts(text) {
            for (how, got) in [
                ("streamed", streamed(shape(family), tools, &pieces)),
                ("whole", whole(shape(family), tools, &pieces)),
            ] {
                assert_eq!(
                    (got.reasoning, got.content, got.calls),
                    want,
                    "{how} {pieces:?}"
                );
            }
        }
    }
}

#[test]
fn reasoning_tokens_count_the_block_and_its_markup() {
    // (family, tokens, reasoning tokens)
    let cases: [(ReasoningFamily, &[&str], usize); 6] = [
        (
            QWEN3,
            &["<", "think", ">", "a", " b", "</", "think", ">", "c"],
            8,
        ),
        (QWEN3, &["<think>", "a", "</think>", "\n\n", "c", " d"], 3),
        (QWEN3, &["c", " d"], 0),
        (R1, &["a", "</think>", "c"], 2),
        (
            HARMONY,
            &[
                "<|channel|>",
                "analysis",
                "<|message|>",
                "x",
                " y",
                "<|end|>",
                "<|start|>",
                "assistant",
                "<|channel|>",
                "final",
                "<|message|>",
                "z",
            ],
            6,
        ),
        (HARMONY, &["<|channel|>", "final", "<|message|>", "z"], 0),
    ];
    for (family, tokens, want) in cases {
        assert_eq!(
            streamed(shape(family), None, tokens).reasoning_tokens,
            want,
            "{tokens:?}"
        );
        assert_eq!(
            whole(shape(family), None, tokens).reasoning_tokens,
            want,
            "{tokens:?}"
        );
    }
}

#[test]
fn include_reasoning_false_drops_it_and_parallel_false_keeps_one_call() {
    let text = "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>commentary to=functions.a<|message|>{}<|call|><|start|>assistant<|channel|>commentary to=functions.b<|message|>{}<|call|>";
    let quiet = Some(ReasoningShape {
        family: HARMONY,
        open: false,
        include: false,
    });
    let one = Some(ToolShape {
        family: ToolFamily::Harmony,
        parallel: false,
    });
    for got in [streamed(quiet, one, &[text]), whole(quiet, one, &[text])] {
        assert_eq!(got.reasoning, None);
        assert_eq!(got.calls, vec![call("a", "{}")]);
        assert!(got.reasoning_tokens > 0);
    }
    // No reasoning parser: the text passes whole.
    assert_eq!(
        whole(None, None, &["<think>x</think>y"]).content,
        "<think>x</think>y"
    );
}

#[test]
fn choices_and_detection() {
    let cases = [
        ("auto", Some("{{ '<|start|>' }}<|channel|>"), Some(HARMONY)),
        ("auto", Some("{% if x %}<think>\n{% endif %}"), Some(QWEN3)),
        ("auto", Some("<|im_start|>"), None),
        ("auto", None, None),
        ("qwen3", None, Some(QWEN3)),
        ("deepseek-r1", None, Some(R1)),
        ("gpt-oss", Some("<|im_start|>"), Some(HARMONY)),
        (
            "auto",
            Some("{{ '<|channel>thought\n<channel|>' }}"),
            Some(GEMMA),
        ),
        ("auto", Some("[THINK]{{ t }}[/THINK]"), Some(MAGISTRAL)),
        ("mistral", None, Some(MAGISTRAL)),
        ("gemma4", None, Some(GEMMA)),
        ("glm45", None, Some(QWEN3)),
        ("none", Some("<think>"), None),
    ];
    for (flag, template, want) in cases {
        let choice: ReasoningChoice = flag.parse().unwrap();
        assert_eq!(choice.resolve(template), want, "{flag} {template:?}");
    }
    let err = "think".parse::<ReasoningChoice>().unwrap_err();
    assert!(err.contains("deepseek-r1"), "{err}");
    assert_eq!(detect("plain"), None);
    assert!(opens_think("<|im_start|>assistant\n<think>\n", THINK));
    assert!(!opens_think(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n",
        THINK
    ));
}

/// Prepares a chat body against the fake frontend with `family`.
fn prepared(
    family: Option<ReasoningFamily>,
    body: serde_json::Value,
) -> crate::openai::prepare::Prepared {
    use crate::openai::fields::{CHAT_FIELDS, parse};
    let config = crate::openai::prepare::PrepareConfig {
        model_name: "fake".into(),
        max_model_len: 128,
        default_max_tokens: 5,
        max_queue: 8,
        tools: crate::tools::parser::ToolSetup {
            family: Some(ToolFamily::Hermes),
            describe: false,
        },
        reasoning: family,
        adapters: None,
    };
    let body = serde_json::to_vec(&body).unwrap();
    let r = parse(&body, &CHAT_FIELDS).unwrap();
    crate::openai::prepare::chat(r, &crate::fixtures::FakeFrontend, &config).unwrap()
}

#[test]
fn the_request_settles_how_its_answer_is_split() {
    use serde_json::json;
    let user = json!([{"role": "user", "content": "hi"}]);
    // (family, body, shape)
    let cases = [
        (None, json!({"messages": user}), None),
        (
            Some(QWEN3),
            json!({"messages": user}),
            Some((QWEN3, false, true)),
        ),
        (
            Some(HARMONY),
            json!({"messages": user, "include_reasoning": false}),
            Some((HARMONY, false, false)),
        ),
    ];
    for (family, body, want) in cases {
        let p = prepared(family, body.clone());
        let got = p.shape.reasoning.map(|r| (r.family, r.open, r.include));
        assert_eq!(got, want, "{body}");
        // Harmony's channels are special tokens: its detokenizer keeps them.
        let eos = p.jobs[0].req.text.fresh().push(crate::fixtures::EOS);
        assert_eq!(eos == "<|eos|>", family == Some(HARMONY), "{body}");
    }
}

#[test]
fn chat_template_kwargs_win_over_reasoning_effort() {
    use serde_json::json;
    let user = json!([{"role": "user", "content": "hi"}]);
    let prompt = |body| prepared(Some(HARMONY), body).jobs[0].req.prompt.clone();
    let high = prompt(json!({"messages": user, "reasoning_effort": "high"}));
    let low = prompt(json!({"messages": user, "reasoning_effort": "low"}));
    let both = prompt(json!({"messages": user, "reasoning_effort": "low",
        "chat_template_kwargs": {"reasoning_effort": "high"}}));
    assert_ne!(high, low);
    assert_eq!(both, high);
}

#[test]
fn a_forced_call_is_refused_for_harmony() {
    use crate::openai::fields::{CHAT_FIELDS, parse};
    let mut config = crate::openai::prepare::PrepareConfig {
        model_name: "fake".into(),
        max_model_len: 128,
        default_max_tokens: 5,
        max_queue: 8,
        tools: crate::tools::parser::ToolSetup {
            family: Some(ToolFamily::Harmony),
            describe: false,
        },
        reasoning: Some(HARMONY),
        adapters: None,
    };
    let body = br#"{"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "f"}}]}"#;
    let err = crate::openai::prepare::chat(
        parse(body, &CHAT_FIELDS).unwrap(),
        &crate::fixtures::FakeFrontend,
        &config,
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("harmony"), "{err}");
    config.tools.family = Some(ToolFamily::Hermes);
    let ok = crate::openai::prepare::chat(
        parse(body, &CHAT_FIELDS).unwrap(),
        &crate::fixtures::FakeFrontend,
        &config,
    );
    assert!(ok.is_ok());
}
