//! ferrox-bench: N concurrent streaming clients against any OpenAI-compatible
//! `/v1/completions`, fixed prompt and output lengths (`ignore_eos`),
//! reporting aggregate tokens/s, TTFT and inter-token latency percentiles,
//! and errors.

mod report;

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use futures::StreamExt;
use serde_json::json;

use crate::report::{Report, Sample};

/// Load generator for OpenAI-compatible servers.
#[derive(Debug, Parser)]
#[command(name = "ferrox-bench", version, about)]
struct Args {
    /// Base URL, e.g. http://127.0.0.1:8000
    #[arg(
        long,
        env = "FERROX_BENCH_URL",
        default_value = "http://127.0.0.1:8000"
    )]
    url: String,
    /// Model name to send; several, comma-separated, are sent in turn
    /// (request i names the (i mod n)-th: a base and its LoRA adapters).
    #[arg(
        long,
        env = "FERROX_BENCH_MODEL",
        default_value = "smol",
        value_delimiter = ','
    )]
    model: Vec<String>,
    /// Concurrent clients.
    #[arg(long, short = 'c', default_value_t = 8)]
    concurrency: usize,
    /// Requests in total.
    #[arg(long, short = 'n', default_value_t = 32)]
    requests: usize,
    /// Prompt length in words (a word is roughly a token).
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    /// Words of a system prompt every request starts with (0: none), as
    /// chat applications resend; the prefix cache computes it once.
    #[arg(long, default_value_t = 0)]
    shared_prefix_len: usize,
    /// Tokens to generate per request.
    #[arg(long, default_value_t = 128)]
    output_len: usize,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// A JSON schema (a file, or the JSON itself) every request's output
    /// must match, sent as `response_format` json_schema.
    #[arg(long)]
    schema: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(args.timeout))
        .build()?;
    let prefix = shared_prefix(args.shared_prefix_len);
    let question = vec!["hello"; args.prompt_len].join(" ");
    let schema = args.schema.as_deref().map(read_schema).transpose()?;
    let body = |i: usize| {
        // Each request's own part starts on a new line, so the shared
        // prefix tokenizes the same in every request.
        let prompt = format!("{prefix}\nQuestion {i}: {question}");
        let model = &args.model[i % args.model.len().max(1)];
        let mut body = json!({
            "model": model, "prompt": prompt, "max_tokens": args.output_len,
            "temperature": 0, "ignore_eos": true, "stream": true,
        });
        if let Some(schema) = &schema {
            body["response_format"] = json!({"type": "json_schema",
                "json_schema": {"name": "bench", "schema": schema}});
        }
        body
    };
    let url = format!("{}/v1/completions", args.url.trim_end_matches('/'));
    let started = Instant::now();
    let samples: Vec<Sample> = futures::stream::iter(0..args.requests)
        .map(|i| {
            let (client, url, body) = (&client, &url, body(i));
            async move { one(client, url, &body).await }
        })
        .buffer_unordered(args.concurrency.max(1))
        .collect()
        .await;
    let report = Report::from_samples(&samples, started.elapsed());
    println!("{}", report.render(args.concurrency));
    Ok(())
}

/// `--schema`: inline JSON, else a file holding it.
fn read_schema(arg: &str) -> anyhow::Result<serde_json::Value> {
    let text = if arg.trim_start().starts_with('{') {
        arg.to_string()
    } else {
        std::fs::read_to_string(arg).with_context(|| format!("reading {arg}"))?
    };
    serde_json::from_str(&text).context("--schema is not JSON")
}

/// A system prompt of `words` words of ordinary English (not one word
/// repeated, which tokenizers compress).
fn shared_prefix(words: usize) -> String {
    const TEXT: &str = "You are a support assistant for a shipping company and answer \
        questions about parcels orders refunds customs delays and addresses politely \
        accurately and briefly without inventing tracking numbers or dates";
    TEXT.split(' ')
        .cycle()
        .take(words)
        .collect::<Vec<_>>()
        .join(" ")
}

/// One streaming request, timed per token.
async fn one(client: &reqwest::Client, url: &str, body: &serde_json::Value) -> Sample {
    let start = Instant::now();
    match stream(client, url, body, start).await {
        Ok(times) => Sample::Ok { token_times: times },
        Err(e) => Sample::Failed(format!("{e:#}")),
    }
}

/// Seconds since `start` at which each text chunk arrived.
async fn stream(
    client: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
    start: Instant,
) -> anyhow::Result<Vec<f64>> {
    let response = client
        .post(url)
        .json(body)
        .send()
        .await
        .context("sending")?;
    let status = response.status();
    if !status.is_success() {
        let text = response.text().await.unwrap_or_default();
        anyhow::bail!("HTTP {status}: {text}");
    }
    let mut times = Vec::new();
    let mut buffer = String::new();
    let mut bytes = response.bytes_stream();
    while let Some(chunk) = bytes.next().await {
        buffer.push_str(&String::from_utf8_lossy(
            &chunk.context("reading the stream")?,
        ));
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            let data = event.trim().strip_prefix("data: ").unwrap_or("");
            if data == "[DONE]" {
                return Ok(times);
            }
            let v: serde_json::Value = serde_json::from_str(data).context("bad event")?;
            if let Some(e) = v.get("error") {
                anyhow::bail!("error event: {e}");
            }
            let text = v["choices"][0]["text"].as_str().unwrap_or("");
            if !text.is_empty() {
                times.push(start.elapsed().as_secs_f64());
            }
        }
    }
    anyhow::bail!("stream ended without [DONE]")
}
