//! `GET /openapi.json`: the API as OpenAPI 3.1, derived from the request
//! and response types and the handlers' path attributes; which operations
//! need the bearer key comes from the route table, and the scheme is in the
//! document only when the server has keys.

use std::sync::OnceLock;

use utoipa::OpenApi;
use utoipa::openapi::PathItem;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};

use crate::openai::response_schema::{ChatCompletionChunk, CompletionChunk};
use crate::serve::routes::{self, Access, Verb, info, lora, prefix};

/// The security scheme's name in the document.
pub const BEARER: &str = "bearer";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "ferrox-server",
        description = "OpenAI-compatible API of ferrox-server (vLLM's extras and tokenizer routes included). \
            Fields the types do not list are refused with a 400 naming them, except those docs/api.md lists as ignored."
    ),
    paths(
        routes::completions,
        routes::chat_completions,
        routes::responses,
        routes::embeddings::embeddings,
        routes::rerank::rerank_v1,
        routes::rerank::rerank,
        routes::rerank::score,
        info::models,
        lora::load_lora_adapter,
        lora::unload_lora_adapter,
        routes::tokenize,
        routes::detokenize,
        info::tokenizer_info,
        prefix::prefix_spec,
        prefix::kv_events,
        info::health,
        info::ready,
        info::metrics,
        info::openapi_json,
    ),
    // Streamed chunks are named in the 200 descriptions; OpenAPI 3.1 has no
    // item schema for event streams.
    components(schemas(CompletionChunk, ChatCompletionChunk))
)]
struct ApiDoc;

/// The document; with `keyed`, the bearer scheme and a security
/// requirement on every keyed route.
pub fn document(keyed: bool) -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    if !keyed {
        return doc;
    }
    let scheme = SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer));
    doc.components
        .get_or_insert_with(Default::default)
        .add_security_scheme(BEARER, scheme);
    for r in routes::table() {
        if r.access != Access::Keyed {
            continue;
        }
        if let Some(op) = doc
            .paths
            .paths
            .get_mut(r.path)
            .and_then(|item| operation(item, r.verb))
        {
            op.security = Some(vec![SecurityRequirement::new(BEARER, Vec::<String>::new())]);
        }
    }
    doc
}

/// The document as JSON, built once per process for each of the two cases.
pub fn json(keyed: bool) -> String {
    static DOCS: [OnceLock<String>; 2] = [OnceLock::new(), OnceLock::new()];
    DOCS[usize::from(keyed)]
        .get_or_init(|| {
            // Serializing these plain maps and strings cannot fail.
            serde_json::to_string(&document(keyed)).unwrap_or_default()
        })
        .clone()
}

/// The operation of `verb` on a path.
pub fn operation(item: &mut PathItem, verb: Verb) -> Option<&mut Operation> {
    match verb {
        Verb::Get => item.get.as_mut(),
        Verb::Post => item.post.as_mut(),
    }
}

#[cfg(test)]
mod tests;
