//! What a router needs from this server to route by prefix: how prompts
//! become block hashes (`GET /prefix_spec`) and which hashes the prefix
//! cache holds (`GET /kv_events`, a cursor over what was stored and evicted).

use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use ferrox_plan::KvTier;
use ferrox_prompt::PrefixSpec;

use crate::openai::error::{ApiError, ErrorBody};
use crate::serve::state::AppState;

/// `GET /prefix_spec`: the tokenizer, chat template, block size and chain
/// root a router rebuilds to hash prompts as this server does.
#[utoipa::path(get, path = "/prefix_spec", tag = "router",
    responses(
        (status = 200, description = "The tokenizer as data, the template, block size and chain root", body = Object),
        (status = 401, description = "No valid key (when the server has keys)", body = ErrorBody),
        (status = 503, description = "The model is still loading", body = ErrorBody),
    ))]
pub(crate) async fn prefix_spec(State(s): State<AppState>) -> Response {
    let Some(loaded) = s.loaded() else {
        return ApiError::Unavailable("the model is still loading".into()).into_response();
    };
    let frontend = std::sync::Arc::clone(&loaded.frontend);
    // Writing a vocabulary down takes a while the first time: off the
    // async threads.
    let text = match tokio::task::spawn_blocking(move || frontend.text_spec()).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return ApiError::Unavailable(e).into_response(),
        Err(e) => return ApiError::Internal(e.to_string()).into_response(),
    };
    let config = loaded.engine.config();
    axum::Json(PrefixSpec {
        model: s.model_name().to_string(),
        block_size: config.block_size,
        root: loaded.engine.block_hasher().map(|h| h.root()),
        max_model_len: config.max_model_len,
        tokenizer: text.tokenizer,
        chat_template: text.chat_template,
        template_tokens: text.template_tokens,
        tool_calls: loaded.tools.family.is_some(),
        describe_tools: loaded.tools.describe,
    })
    .into_response()
}

/// `since`, `epoch` (both default 0) and `tier` (default the device
/// pool) of a `/kv_events` query.
fn cursor(query: Option<&str>) -> Result<(u64, u64, KvTier), ApiError> {
    let (mut since, mut epoch, mut tier) = (0, 0, KvTier::Device);
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let slot = match key {
            "since" => &mut since,
            "epoch" => &mut epoch,
            "tier" => {
                tier = value
                    .parse()
                    .map_err(|e: String| ApiError::invalid(key, e))?;
                continue;
            }
            other => {
                return Err(ApiError::invalid(
                    other,
                    format!("unknown query parameter `{other}`; expected since, epoch and tier"),
                ));
            }
        };
        *slot = value.parse().map_err(|_| {
            ApiError::invalid(
                key,
                format!("`{key}` must be a whole number, not {value:?}"),
            )
        })?;
    }
    Ok((since, epoch, tier))
}

/// `GET /kv_events?since=N&epoch=E&tier=T`: the block hashes the prefix
/// cache's tier `T` (`device`, the default; `host`, `disk`) stored and
/// evicted since cursor `N` of its log `E`; the whole held set (`reset`) for
/// a first read, a reader too far behind, or one of another log; an empty
/// page for a tier this server does not keep.
#[utoipa::path(get, path = "/kv_events", tag = "router",
    params(
        ("since" = Option<u64>, Query, description = "The cursor of the last page read (0: from the start)"),
        ("epoch" = Option<u64>, Query, description = "The epoch of the last page read"),
        ("tier" = Option<String>, Query, description = "device (default), host or disk"),
    ),
    responses(
        (status = 200, description = "{epoch, cursor, reset, stored: [hash], evicted: [hash]}; hashes are 64 hex digits", body = Object),
        (status = 400, description = "A bad cursor", body = ErrorBody),
        (status = 401, description = "No valid key (when the server has keys)", body = ErrorBody),
        (status = 503, description = "The model is still loading", body = ErrorBody),
    ))]
pub(crate) async fn kv_events(State(s): State<AppState>, RawQuery(q): RawQuery) -> Response {
    let (since, epoch, tier) = match cursor(q.as_deref()) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let Some(loaded) = s.loaded() else {
        return ApiError::Unavailable("the model is still loading".into()).into_response();
    };
    axum::Json(loaded.engine.tier_events(tier, since, epoch)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cursor_query() {
        use KvTier::*;
        type Want = Result<(u64, u64, KvTier), &'static str>;
        let cases: [(Option<&str>, Want); 9] = [
            (None, Ok((0, 0, Device))),
            (Some("since=5&epoch=7"), Ok((5, 7, Device))),
            (Some("epoch=7"), Ok((0, 7, Device))),
            (Some("tier=disk&since=2"), Ok((2, 0, Disk))),
            (Some("tier=host"), Ok((0, 0, Host))),
            (Some("tier=ssd"), Err("not a KV tier")),
            (Some("since=-1"), Err("whole number")),
            (Some("since"), Err("whole number")),
            (Some("from=3"), Err("unknown query parameter `from`")),
        ];
        for (q, want) in cases {
            match (cursor(q), want) {
                (Ok(got), Ok(w)) => assert_eq!(got, w, "{q:?}"),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{q:?}: {e}"),
                (got, w) => panic!("{q:?}: {got:?} vs {w:?}"),
            }
        }
    }
}
