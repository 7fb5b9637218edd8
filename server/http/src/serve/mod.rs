//! The HTTP server: the edge, routes and handlers, keys, OpenAPI, shared state, the lifecycle.

pub mod app;
pub mod auth;
pub mod edge;
pub mod fault;
pub mod frontend;
pub mod openapi;
pub mod routes;
pub mod server;
pub mod state;
