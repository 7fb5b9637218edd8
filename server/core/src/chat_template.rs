//! The model's own Jinja chat template, rendered with minijinja.

use std::path::Path;

use minijinja::{Environment, ErrorKind, context};
use serde::Serialize;
use serde_json::Value;

use crate::error::Error;

const TEMPLATE_NAME: &str = "chat";

/// One chat message as templates see it. Optional parts are left out of
/// the template's view when absent, so `message.name is defined` works.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// The message text (empty for an assistant turn that only calls tools).
    pub content: String,
    /// The participant's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant turn's tool calls, `{id, type, function: {name,
    /// arguments}}` with `arguments` as an object where it parses (the
    /// Llama 3.x and Qwen templates index into it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
    /// The call a `tool` message answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant turn's reasoning sent back, as Qwen3's templates read
    /// it; [`ChatMessage::with_reasoning`] sets it with `thinking`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The same reasoning under the name gpt-oss's template reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            ..Self::default()
        }
    }

    /// This message with `reasoning` under both names templates read it by.
    pub fn with_reasoning(self, reasoning: Option<String>) -> Self {
        Self {
            thinking: reasoning.clone(),
            reasoning_content: reasoning,
            ..self
        }
    }
}

/// What one render gets besides the messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct RenderOptions<'a> {
    /// Open the assistant's turn at the end.
    pub add_generation_prompt: bool,
    /// End the text right after the last message's content, so the model
    /// continues that message (vLLM's and transformers'
    /// `continue_final_message`).
    pub continue_final_message: bool,
    /// Tool definitions (`tools` in the template), if any.
    pub tools: Option<&'a [Value]>,
    /// More variables for the template (`chat_template_kwargs`, e.g.
    /// `enable_thinking`); the named ones above win over these.
    pub kwargs: Option<&'a serde_json::Map<String, Value>>,
}

/// A compiled chat template plus the special token strings it may use.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

fn template_err(e: minijinja::Error) -> Error {
    // `{:#}` adds the template line and the cause chain.
    Error::ChatTemplate(format!("{e:#}"))
}

fn raise_exception(message: String) -> Result<String, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// Hugging Face's `strftime_now(format)`: the current UTC time, formatted.
/// The Llama 3.x templates call it for "Today Date".
fn strftime_now(format: String) -> Result<String, minijinja::Error> {
    use std::fmt::Write;
    let now = chrono::DateTime::<chrono::Utc>::from(std::time::SystemTime::now());
    let mut out = String::new();
    // chrono reports a bad format specifier as a fmt error, not a panic.
    write!(out, "{}", now.format(&format)).map_err(|_| {
        minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format {format:?}"),
        )
    })?;
    Ok(out)
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are passed to every render.
    pub fn new(
        source: impl Into<String>,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, Error> {
        let mut env = Environment::new();
        // Hugging Face renders with trim_blocks and lstrip_blocks on.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", crate::py_json::tojson);
        env.add_test("iterable", is_iterable);
        let source = source.into();
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(template_err)?;
        Ok(Self {
            env,
            source,
            bos_token,
            eos_token,
        })
    }

    /// Reads `chat_template` (a string, or a list of `{name, template}`) and the
    /// BOS/EOS strings from a `tokenizer_config.json`.
    pub fn from_tokenizer_config(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })?;
        let config: Value = serde_json::from_str(&text)
            .map_err(|e| Error::ChatTemplate(format!("{}: {e}", path.display())))?;
        let source = template_source(&config).ok_or_else(|| {
            Error::ChatTemplate(format!("{} has no chat_template", path.display()))
        })?;
        Self::new(
            source,
            token_string(&config, "bos_token"),
            token_string(&config, "eos_token"),
        )
    }

    /// The template's text (what tool-call family it writes is read from it).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The BOS and EOS strings every render gets.
    pub fn special_tokens(&self) -> (Option<&str>, Option<&str>) {
        (self.bos_token.as_deref(), self.eos_token.as_deref())
    }

    /// Renders `messages`; `add_generation_prompt` opens the assistant's turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        let options = RenderOptions {
            add_generation_prompt,
            ..RenderOptions::default()
        };
        self.render_with(messages, &options)
    }

    /// Renders `messages` with `options` (the generation prompt, tools).
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        options: &RenderOptions<'_>,
    ) -> Result<String, Error> {
        let template = self.env.get_template(TEMPLATE_NAME).map_err(template_err)?;
        let extra = minijinja::Value::from_serialize(options.kwargs);
        let text = template
            .render(context! {
                messages => messages,
                add_generation_prompt => options.add_generation_prompt,
                tools => options.tools,
                bos_token => self.bos_token.as_deref().unwrap_or(""),
                eos_token => self.eos_token.as_deref().unwrap_or(""),
                ..extra
            })
            .map_err(template_err)?;
        match (options.continue_final_message, messages.last()) {
            (true, Some(last)) => continue_final(text, &last.content),
            _ => Ok(text),
        }
    }
}

/// Jinja2's `iterable`: `none` is not (minijinja iterates it as empty),
/// so `tools is iterable and tools | length > 0` (Nemotron's template)
/// holds only for a list.
fn is_iterable(v: &minijinja::Value) -> bool {
    !v.is_none() && v.try_iter().is_ok()
}

/// `text` cut right after the last occurrence of the final message's
/// content (trailing whitespace aside), as transformers does it: whatever
/// the template closes the turn with is dropped.
fn continue_final(mut text: String, content: &str) -> Result<String, Error> {
    let content = content.trim_end();
    let at = text
        .rfind(content)
        .filter(|_| !content.is_empty())
        .ok_or_else(|| {
            Error::ChatTemplate(
                "continue_final_message: the final message's content is not in the rendered \
             template (an empty message, or one the template rewrites)"
                    .into(),
            )
        })?;
    text.truncate(at + content.len());
    Ok(text)
}

/// The default template of a config: the string, or the list entry named
/// `default` (else the first).
fn template_source(config: &Value) -> Option<String> {
    match config.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => {
            let named = |n: &Value| n.get("name").and_then(Value::as_str) == Some("default");
            let entry = list.iter().find(|e| named(e)).or_else(|| list.first())?;
            entry.get("template")?.as_str().map(str::to_string)
        }
        _ => None,
    }
}

/// A special token as `tokenizer_config.json` writes it: a string or `{content}`.
fn token_string(config: &Value, key: &str) -> Option<String> {
    match config.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_chatml_with_and_without_generation_prompt() {
        let t = ChatTemplate::new(CHATML, None, None).unwrap();
        let msgs = [ChatMessage::new("user", "Hi")];
        let cases = [
            (
                true,
                "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
            ),
            (false, "<|im_start|>user\nHi<|im_end|>\n"),
        ];
        for (gen_prompt, want) in cases {
            assert_eq!(t.render(&msgs, gen_prompt).unwrap(), want);
        }
    }

    #[test]
    fn bos_eos_pycompat_and_trim_blocks() {
        let src = "{{ bos_token }}\n{% for m in messages %}\n  {{ m.content.strip().upper() }}{{ eos_token }}\n{% endfor %}";
        let t = ChatTemplate::new(src, Some("<s>".into()), Some("</s>".into())).unwrap();
        let out = t
            .render(&[ChatMessage::new("user", "  hi ")], false)
            .unwrap();
        assert_eq!(out, "<s>\n  HI</s>\n");
    }

    #[test]
    fn errors_are_clear() {
        let raising = "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok";
        let t = ChatTemplate::new(raising, None, None).unwrap();
        let err = t
            .render(&[ChatMessage::new("system", "x")], false)
            .unwrap_err();
        assert!(err.to_string().contains("first must be user"), "{err}");
        assert_eq!(
            t.render(&[ChatMessage::new("user", "x")], false).unwrap(),
            "ok"
        );
        let err = ChatTemplate::new("{% for %}", None, None).unwrap_err();
        assert!(matches!(err, Error::ChatTemplate(_)), "{err}");
    }

    #[test]
    fn tool_fields_names_and_helpers_reach_the_template() {
        let src = "{% for m in messages %}{{ m.role }}\
{% if m.name is defined %}({{ m.name }}){% endif %}:{{ m.content }}\
{% if m.tool_calls is defined %}{% for c in m.tool_calls %}[{{ c.function.name }} {{ c.function.arguments.city }}]{% endfor %}{% endif %}\
{% if m.tool_call_id is defined %}<{{ m.tool_call_id }}>{% endif %};{% endfor %}\
{% if tools %}{% for t in tools %}T={{ t.function.name }};{% endfor %}{% endif %}\
{{ strftime_now('%Y') | length }}";
        let t = ChatTemplate::new(src, None, None).unwrap();
        let call = serde_json::json!({"id": "c1", "type": "function",
            "function": {"name": "weather", "arguments": {"city": "Oslo"}}});
        let messages = [
            ChatMessage {
                name: Some("ann".into()),
                ..ChatMessage::new("user", "hi")
            },
            ChatMessage {
                tool_calls: Some(vec![call]),
                ..ChatMessage::new("assistant", "")
            },
            ChatMessage {
                tool_call_id: Some("c1".into()),
                ..ChatMessage::new("tool", "sunny")
            },
        ];
        let tools = [serde_json::json!({"type": "function", "function": {"name": "weather"}})];
        let cases: [(Option<&[Value]>, &str); 2] = [
            (
                None,
                "user(ann):hi;assistant:[weather Oslo];tool:sunny<c1>;4",
            ),
            (
                Some(&tools),
                "user(ann):hi;assistant:[weather Oslo];tool:sunny<c1>;T=weather;4",
            ),
        ];
        for (tools, want) in cases {
            let options = RenderOptions {
                tools,
                ..RenderOptions::default()
            };
            assert_eq!(t.render_with(&messages, &options).unwrap(), want);
        }
    }

    #[test]
    fn kwargs_reach_the_template_and_a_final_message_is_continued() {
        let source = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}\
                      {% if enable_thinking is defined and not enable_thinking %}[no-think]{% endif %}\
                      {% if add_generation_prompt %}<assistant>{% endif %}";
        let t = ChatTemplate::new(source, None, None).unwrap();
        let messages = [
            ChatMessage::new("user", "hi"),
            ChatMessage::new("assistant", "Once upon  "),
        ];
        let off: serde_json::Map<String, Value> =
            serde_json::from_str(r#"{"enable_thinking": false, "add_generation_prompt": true}"#)
                .unwrap();
        // (options, rendered text)
        let cases = [
            (
                RenderOptions::default(),
                "<user>hi</user><assistant>Once upon  </assistant>",
            ),
            (
                RenderOptions {
                    kwargs: Some(&off),
                    ..RenderOptions::default()
                },
                // A kwarg cannot turn on what the request turned off.
                "<user>hi</user><assistant>Once upon  </assistant>[no-think]",
            ),
            (
                RenderOptions {
                    continue_final_message: true,
                    ..RenderOptions::default()
                },
                "<user>hi</user><assistant>Once upon",
            ),
        ];
        for (options, want) in cases {
            assert_eq!(t.render_with(&messages, &options).unwrap(), want);
        }
        let empty = [ChatMessage::new("assistant", "")];
        let cont = RenderOptions {
            continue_final_message: true,
            ..RenderOptions::default()
        };
        let e = t.render_with(&empty, &cont).unwrap_err().to_string();
        assert!(e.contains("continue_final_message"), "{e}");
    }

    #[test]
    fn iterable_is_jinja2_s() {
        // None is not iterable, as in Python; a missing variable, a string
        // and a list are.
        let t = ChatTemplate::new(
            "{{ tools is iterable }} {{ nothing is iterable }} {{ 'ab' is iterable }} \
             {{ [1] is iterable }} {{ 3 is iterable }}",
            None,
            None,
        )
        .unwrap();
        let cases = [
            (None, "False True True True False"),
            (Some(&[][..]), "True True True True False"),
        ];
        for (tools, want) in cases {
            let options = RenderOptions {
                tools,
                ..RenderOptions::default()
            };
            assert_eq!(t.render_with(&[], &options).unwrap(), want);
        }
    }

    #[test]
    fn tokenizer_config_forms() {
        let dir = std::env::temp_dir().join(format!("ferrox-chat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cases = [
            (
                r#"{"chat_template": "{{ bos_token }}A{{ eos_token }}", "bos_token": "<s>", "eos_token": {"content": "</s>"}}"#,
                Some("<s>A</s>"),
            ),
            (
                r#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}"#,
                Some("D"),
            ),
            (r#"{"bos_token": "<s>"}"#, None),
            ("not json", None),
        ];
        for (i, (json, want)) in cases.into_iter().enumerate() {
            let path = dir.join(format!("c{i}.json"));
            std::fs::write(&path, json).unwrap();
            let got = ChatTemplate::from_tokenizer_config(&path).and_then(|t| t.render(&[], false));
            match want {
                Some(w) => assert_eq!(got.unwrap(), w),
                None => assert!(matches!(got, Err(Error::ChatTemplate(_))), "{got:?}"),
            }
        }
        let missing = ChatTemplate::from_tokenizer_config(dir.join("none.json"));
        assert!(matches!(missing, Err(Error::Io { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
