//! Building a decoder from any weight source (GGUF or safetensors), by the
//! GGUF tensor names; sources translate names of their own format.

pub mod source;

use candle_core::{Device, Tensor};

use crate::decoder::Decoder;
use crate::error::{Error, Result};
use crate::ffn::mlp;
use crate::ffn::moe;
use crate::layer::{Block, Ffn, Layer, RecurrentMixer, SsmLayer};
use crate::mixer::{gdn, mamba2};
use crate::projection::single;
use crate::spec::{FeedForward, Mixer, ModelSpec};
use source::{WeightSource, norm};

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
        let block = match &spec.layers[i].mixer {
            Mixer::Attention(_) => Block::Attention(Box::new(load_layer(src, &spec, i, device)?)),
            Mixer::Mamba2(s) => {
                let at = (i, spec.hidden);
                let mixer = RecurrentMixer::Mamba2(mamba2::load::load(src, s, at, device)?);
                Block::Ssm(Box::new(recurrent_layer(src, &spec, mixer, i, device)?))
            }
            Mixer::GatedDeltaNet(g) => {
                let at = (i, spec.hidden);
                let mixer = RecurrentMixer::GatedDeltaNet(gdn::load::load(src, g, at, device)?);
                Block::Ssm(Box::new(recurrent_layer(src, &spec, mixer, i, device)?))
            }
        };
        layers.push(block);
    }
    let norm = norm(src, &spec, "output_norm.weight", spec.hidden, device)?;
    let lm_head = if src.has("output.weight") {
        single(src.projection(&[("output.weight", spec.vocab)], spec.hidden, device)?)
    } else {
        embed.as_linear()
    };
    Decoder::new(spec, embed, layers, norm, lm_head, device)
}

fn load_layer(
    src: &mut dyn WeightSource,
    spec: &ModelSpec,
    i: usize,
    device: &Device,
) -> Result<Layer> {
    let n = |s: &str| format!("blk.{i}.{s}");
    let hidden = spec.hidden;
    let (q_dim, kv_dim) = (spec.q_dim(), spec.kv_dim());
    let attn = spec.layers[i]
        .attention()
        .ok_or_else(|| Error::Config(format!("layer {i} is not an attention layer")))?;
    // A gated query projection's rows hold each head's query, then its gate.
    let q_rows = if attn.gated { 2 * q_dim } else { q_dim };
    // Phi-3 stores q, k, v as one matrix, and gate, up as one `ffn_up`.
    let qkv = if src.has(&n("attn_qkv.weight")) {
        src.projection(
            &[(&n("attn_qkv.weight"), q_rows + 2 * kv_dim)],
            hidden,
            device,
        )?
    } else {
        let (q, k, v) = (n("attn_q.weight"), n("attn_k.weight"), n("attn_v.weight"));
        src.projection(&[(&q, q_rows), (&k, kv_dim), (&v, kv_dim)], hidden, device)?
    };
    let qkv_bias = if spec.qkv_bias {
        let parts = [
            src.vector(&n("attn_q.bias"), q_rows, device)?,
            src.vector(&n("attn_k.bias"), kv_dim, device)?,
            src.vector(&n("attn_v.bias"), kv_dim, device)?,
        ];
        Some(Tensor::cat(&parts, 0)?)
    } else {
        None
    };
    let hd = spec.head_dim;
    let qk_norm = match attn.qk_norm {
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
    let ffn = load_ffn(src, spec, i, device)?
        .ok_or_else(|| Error::Config(format!("layer {i}: attention without a feed-forward")))?;
    let o_bias = match src.has(&n("attn_output.bias")) {
        true => Some(src.vector(&n("attn_output.bias"), hidden, device)?),
        false => None,
    };
    let sinks = match attn.sinks {
        true => Some(src.vector(&n("attn_sinks.weight"), spec.heads, device)?),
        false => None,
    };
    Ok(Layer {
        attn_norm: norm(src, spec, &n("attn_norm.weight"), hidden, device)?,
        qkv,
        qkv_bias,
        qk_norm,
        o: single(src.projection(&[(&n("attn_output.weight"), hidden)], q_dim, device)?),
        o_bias,
        sinks,
        post_attn_norm: post(src, spec.norms.post_attention, "post_attention_norm.weight")?,
        ffn_norm: norm(src, spec, &n("ffn_norm.weight"), hidden, device)?,
        ffn,
        post_ffn_norm: post(src, spec.norms.post_ffn, "post_ffw_norm.weight")?,
    })
}

/// Layer `i`'s feed-forward, if its kind has one.
fn load_ffn(
    src: &mut dyn WeightSource,
    spec: &ModelSpec,
    i: usize,
    device: &Device,
) -> Result<Option<Ffn>> {
    let (hidden, inter) = (spec.hidden, spec.intermediate);
    Ok(match spec.layers[i].ffn {
        FeedForward::Moe(m) => Some(Ffn::Moe(Box::new(moe::load::load(
            src, &m, i, hidden, device,
        )?))),
        FeedForward::Gated(_) => Some(Ffn::Dense(mlp::load(src, i, "", (hidden, inter), device)?)),
        FeedForward::None => None,
    })
}

/// Layer `i` around its recurrent `mixer`: the pre-norm, and any
/// feed-forward with its own.
fn recurrent_layer(
    src: &mut dyn WeightSource,
    spec: &ModelSpec,
    mixer: RecurrentMixer,
    i: usize,
    device: &Device,
) -> Result<SsmLayer> {
    let n = |t: &str| format!("blk.{i}.{t}");
    let hidden = spec.hidden;
    let ffn = match load_ffn(src, spec, i, device)? {
        Some(f) => Some((norm(src, spec, &n("ffn_norm.weight"), hidden, device)?, f)),
        None => None,
    };
    Ok(SsmLayer {
        norm: norm(src, spec, &n("attn_norm.weight"), hidden, device)?,
        mixer,
        ffn,
    })
}
