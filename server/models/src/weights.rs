//! Building a decoder from any weight source (GGUF or safetensors), by the
//! GGUF tensor names; sources translate names of their own format.

use candle_core::{Device, Tensor};

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::layer::{Layer, Projection};
use crate::linear::{Embedding, Linear};
use crate::llama::Llama;

/// Where weights come from.
pub trait WeightSource {
    /// Whether the tensor exists.
    fn has(&self, name: &str) -> bool;
    /// A 1-D f32 tensor (norm weights, biases) of length `len`.
    fn vector(&mut self, name: &str, len: usize, device: &Device) -> Result<Tensor>;
    /// Matrices `[out_i, cols]` that read the same input, fused where possible.
    fn projection(
        &mut self,
        parts: &[(&str, usize)],
        cols: usize,
        device: &Device,
    ) -> Result<Projection>;
    /// The embedding table `[vocab, hidden]`.
    fn embedding(
        &mut self,
        name: &str,
        vocab: usize,
        hidden: usize,
        device: &Device,
    ) -> Result<Embedding>;
}

/// Checks a weight's shape against the one the architecture wants.
pub fn check_shape(name: &str, got: &[usize], want: &[usize]) -> Result<()> {
    if got != want {
        return Err(Error::BadShape {
            name: name.to_string(),
            got: got.to_vec(),
            want: want.to_vec(),
        });
    }
    Ok(())
}

/// Loads every tensor the architecture needs and assembles the decoder.
pub fn build_llama(
    src: &mut dyn WeightSource,
    config: ModelConfig,
    device: &Device,
) -> Result<Llama> {
    let c = &config;
    let embed = src.embedding("token_embd.weight", c.vocab, c.hidden, device)?;
    // Not `with_capacity`: the count is the file's word, and a corrupt one
    // must fail at the first missing layer, not abort on the allocation.
    let mut layers = Vec::new();
    for i in 0..c.layers {
        layers.push(load_layer(src, c, i, device)?);
    }
    let norm = src.vector("output_norm.weight", c.hidden, device)?;
    let lm_head = if src.has("output.weight") {
        single(src.projection(&[("output.weight", c.vocab)], c.hidden, device)?)
    } else {
        embed.as_linear()
    };
    Llama::new(config, embed, layers, norm, lm_head, device)
}

fn single(p: Projection) -> Linear {
    match p {
        Projection::Fused(l) => l,
        Projection::Split(mut v) => v.remove(0),
    }
}

fn load_layer(
    src: &mut dyn WeightSource,
    c: &ModelConfig,
    i: usize,
    device: &Device,
) -> Result<Layer> {
    let n = |s: &str| format!("blk.{i}.{s}");
    let (q_dim, kv_dim) = (c.heads * c.head_dim, c.kv_dim());
    let (q, k, v) = (n("attn_q.weight"), n("attn_k.weight"), n("attn_v.weight"));
    let qkv = src.projection(&[(&q, q_dim), (&k, kv_dim), (&v, kv_dim)], c.hidden, device)?;
    let qkv_bias = if c.arch.qkv_bias() {
        let parts = [
            src.vector(&n("attn_q.bias"), q_dim, device)?,
            src.vector(&n("attn_k.bias"), kv_dim, device)?,
            src.vector(&n("attn_v.bias"), kv_dim, device)?,
        ];
        Some(Tensor::cat(&parts, 0)?)
    } else {
        None
    };
    let (gate, up) = (n("ffn_gate.weight"), n("ffn_up.weight"));
    Ok(Layer {
        attn_norm: src.vector(&n("attn_norm.weight"), c.hidden, device)?,
        qkv,
        qkv_bias,
        o: single(src.projection(&[(&n("attn_output.weight"), c.hidden)], q_dim, device)?),
        ffn_norm: src.vector(&n("ffn_norm.weight"), c.hidden, device)?,
        gate_up: src.projection(
            &[(&gate, c.intermediate), (&up, c.intermediate)],
            c.hidden,
            device,
        )?,
        down: single(src.projection(
            &[(&n("ffn_down.weight"), c.hidden)],
            c.intermediate,
            device,
        )?),
    })
}
