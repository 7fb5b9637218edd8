//! The whole API as one router: the route table, the key check on its keyed
//! routes, and the OpenAPI document that describes the table.

use axum::extract::DefaultBodyLimit;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router, middleware};

use crate::openai::error::ApiError;
use crate::serve::routes::info::ApiDocument;
use crate::serve::routes::{Access, table};
use crate::serve::state::AppState;
use crate::serve::{auth, openapi};

/// The whole API. The keyed routes need a key when keys are configured;
/// probes, scraping and the API description never do.
pub fn router(state: AppState) -> Router {
    let limit = state.max_body();
    // The document lists the handler that serves it: it is built here, above
    // both, and handed over, so that neither file imports the other.
    let doc = ApiDocument(openapi::json(!state.api_keys().is_open()));
    let (mut keyed, mut public) = (Router::new(), Router::new());
    for r in table() {
        match r.access {
            Access::Keyed => keyed = keyed.route(r.path, r.handler),
            Access::Public => public = public.route(r.path, r.handler),
        }
    }
    let keyed = keyed.route_layer(middleware::from_fn_with_state(
        state.clone(),
        auth::require_key,
    ));
    public
        .merge(keyed)
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(limit))
        .layer(Extension(doc))
        .with_state(state)
}

async fn not_found() -> Response {
    ApiError::NoRoute.into_response()
}
