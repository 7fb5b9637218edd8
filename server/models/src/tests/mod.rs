//! Decoder tests: tiny random models through the real loaders, every family
//! against transformers' committed references, and the real default model
//! against its reference output.

mod corrupt;
mod deepseek;
mod drift;
mod embeddings;
mod families;
mod families_engine;
mod gpu_holding;
mod half;
mod helpers;
mod lfm2;
mod lora;
mod lora_engine;
mod lora_families;
mod lora_reference;
mod missing;
mod moe_dispatch;
mod mxfp4;
mod params;
mod prefix_cache;
mod real_model;
mod recurrent;
mod reference;
mod requantized;
mod request;
mod speculative;
mod tiny_model;
mod window;
