//! Hugging Face's `tojson` filter for chat templates: Python's `json.dumps`
//! with `ensure_ascii=False` (separators `", "` and `": "`, or `","` and
//! `": "` with an indent), not minijinja's compact, HTML-escaped one.
//! Templates put its output into the prompt (gpt-oss's tool calls and
//! results), so it must be byte for byte what transformers renders.

use std::fmt::Write;

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind};

/// `value | tojson(indent=N)`.
pub(crate) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    // Accepted and ignored, as they change nothing here.
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    write(&mut out, &json, indent, sort_keys == Some(true), 0);
    Ok(Value::from_safe_string(out))
}

fn write(out: &mut String, v: &serde_json::Value, indent: Option<usize>, sort: bool, depth: usize) {
    use serde_json::Value as J;
    let item_sep = if indent.is_some() { "," } else { ", " };
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    match v {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write(out, item, indent, sort, depth + 1);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            let mut entries: Vec<_> = map.iter().collect();
            if sort {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                let _ = write!(out, "{}: ", J::String(k.clone()));
                write(out, item, indent, sort, depth + 1);
            }
            newline(out, depth);
            out.push('}');
        }
        // Scalars, `[]` and `{}` print as serde_json prints them, which is
        // Python's spelling (strings escaped alike, UTF-8 kept).
        other => {
            let _ = write!(out, "{other}");
        }
    }
}

#[cfg(test)]
mod tests {
    use minijinja::{Environment, context};

    #[test]
    fn prints_as_python_json_dumps() {
        let mut env = Environment::new();
        env.add_filter("tojson", super::tojson);
        let value = serde_json::json!({"b": [1, 2.5, "x\"y\n"], "a": {}, "é": null, "c": []});
        // (template, rendered: what json.dumps writes)
        let cases = [
            (
                "{{ v | tojson }}",
                r#"{"b": [1, 2.5, "x\"y\n"], "a": {}, "é": null, "c": []}"#,
            ),
            (
                "{{ v | tojson(indent=1) }}",
                "{\n \"b\": [\n  1,\n  2.5,\n  \"x\\\"y\\n\"\n ],\n \"a\": {},\n \"é\": null,\n \"c\": []\n}",
            ),
            (
                "{{ v | tojson(sort_keys=true) }}",
                r#"{"a": {}, "b": [1, 2.5, "x\"y\n"], "c": [], "é": null}"#,
            ),
            ("{{ '<a & b>' | tojson }}", r#""<a & b>""#),
        ];
        for (source, want) in cases {
            let got = env.render_str(source, context! { v => value }).unwrap();
            assert_eq!(got, want, "{source}");
        }
    }
}
