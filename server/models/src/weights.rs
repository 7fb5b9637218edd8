//! Building a decoder from any weight source (GGUF or safetensors), by the
//! GGUF tensor names; sources translate names of their own format.

use candle_core::{Device, Tensor};

use crate::decoder::Decoder;
use crate::error::{Error, Result};
use crate::layer::{Layer, Projection};
use crate::linear::{Embedding, Linear};
use crate::spec::ModelSpec;

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

/// Loads every tensor `spec` needs and assembles the decoder.
pub fn build_decoder(
    src: &mut dyn WeightSource,
    spec: ModelSpec,
    device: &Device,
) -> Result<Decoder> {
    let embed = src.embedding("token_embd.weight", spec.vocab, spec.hidden, device)?;
    // Not `with_capacity`: the count is the file's word, and a corrupt one
    // must fail at the first missing layer, not abort on the allocation.
    let mut layers = Vec::new();
    for i in 0..spec.layers.len() {
        layers.push(load_layer(src, &spec, i, device)?);
    }
    let norm = norm(src, &spec, "output_norm.weight", spec.hidden, device)?;
    let lm_head = if src.has("output.weight") {
        single(src.projection(&[("output.weight", spec.vocab)], spec.hidden, device)?)
    } else {
        embed.as_linear()
    };
    Decoder::new(spec, embed, layers, norm, lm_head, device)
}

fn single(p: Projection) -> Linear {
    match p {
        Projection::Fused(l) => l,
        Projection::Split(mut v) => v.remove(0),
    }
}

/// A norm weight with the family's offset added (Gemma's `1 + w`).
fn norm(
    src: &mut dyn WeightSource,
    spec: &ModelSpec,
    name: &str,
    len: usize,
    device: &Device,
) -> Result<Tensor> {
    let w = src.vector(name, len, device)?;
    if spec.norms.offset == 0.0 {
        return Ok(w);
    }
    Ok((w + f64::from(spec.norms.offset))?)
}

fn load_layer(
    src: &mut dyn WeightSource,
    spec: &ModelSpec,
    i: usize,
    device: &Device,
) -> Result<Layer> {
    let n = |s: &str| format!("blk.{i}.{s}");
    let (hidden, inter) = (spec.hidden, spec.intermediate);
    let (q_dim, kv_dim) = (spec.q_dim(), spec.kv_dim());
    // Phi-3 stores q, k, v as one matrix, and gate, up as one `ffn_up`.
    let qkv = if src.has(&n("attn_qkv.weight")) {
        src.projection(
            &[(&n("attn_qkv.weight"), q_dim + 2 * kv_dim)],
            hidden,
            device,
        )?
    } else {
        let (q, k, v) = (n("attn_q.weight"), n("attn_k.weight"), n("attn_v.weight"));
        src.projection(&[(&q, q_dim), (&k, kv_dim), (&v, kv_dim)], hidden, device)?
    };
    let qkv_bias = if spec.qkv_bias {
        let parts = [
            src.vector(&n("attn_q.bias"), q_dim, device)?,
            src.vector(&n("attn_k.bias"), kv_dim, device)?,
            src.vector(&n("attn_v.bias"), kv_dim, device)?,
        ];
        Some(Tensor::cat(&parts, 0)?)
    } else {
        None
    };
    let hd = spec.head_dim;
    let qk_norm = match spec.layers[i].attention().qk_norm {
        true => Some((
            norm(src, spec, &n("attn_q_norm.weight"), hd, device)?,
            norm(src, spec, &n("attn_k_norm.weight"), hd, device)?,
        )),
        false => None,
    };
    let post = |src: &mut dyn WeightSource, on: bool, name: &str| -> Result<Option<Tensor>> {
        on.then(|| norm(src, spec, &n(name), hidden, device))
            .transpose()
    };
    let gate_up = if src.has(&n("ffn_gate.weight")) {
        let (gate, up) = (n("ffn_gate.weight"), n("ffn_up.weight"));
        src.projection(&[(&gate, inter), (&up, inter)], hidden, device)?
    } else {
        src.projection(&[(&n("ffn_up.weight"), 2 * inter)], hidden, device)?
    };
    Ok(Layer {
        attn_norm: norm(src, spec, &n("attn_norm.weight"), hidden, device)?,
        qkv,
        qkv_bias,
        qk_norm,
        o: single(src.projection(&[(&n("attn_output.weight"), hidden)], q_dim, device)?),
        post_attn_norm: post(src, spec.norms.post_attention, "post_attention_norm.weight")?,
        ffn_norm: norm(src, spec, &n("ffn_norm.weight"), hidden, device)?,
        gate_up,
        down: single(src.projection(&[(&n("ffn_down.weight"), hidden)], inter, device)?),
        post_ffn_norm: post(src, spec.norms.post_ffn, "post_ffw_norm.weight")?,
    })
}
