//! Decoder tests: tiny random models through the real loaders, and the real
//! default model against its reference output.

mod corrupt;
mod gpu_holding;
mod helpers;
mod prefix_cache;
mod real_model;
mod tiny_model;
mod window;
