//! Building a decoder from any weight source (GGUF or safetensors), by the
//! GGUF tensor names; sources translate names of their own format.

pub mod source;

use candle_core::{Device, Tensor};

use crate::decoder::Decoder;
use crate::error::Result;
use crate::ffn::dense_and_moe::DenseAndMoe;
use crate::ffn::{mlp, moe};
use crate::input::InputWeights;
use crate::layer::{Ffn, FfnBlock, Layer, MixerWeights};
use crate::mixer::{attention, gdn, latent, mamba2, short_conv};
use crate::per_layer_input::PerLayerGate;
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
    let input = InputWeights::load(src, &spec, device)?;
    // Not `with_capacity`: the count is the file's word, and a corrupt one
    // must fail at the first missing layer, not abort on the allocation.
    let mut layers = Vec::new();
    for i in 0..spec.layers.len() {
        layers.push(load_layer(src, &spec, i, device)?);
    }
    let norm = match spec.final_norm {
        true => Some(crate::norm::load(
            src,
            &spec,
            "output_norm.weight",
            spec.hidden,
            device,
        )?),
        false => None,
    };
    let lm_head = if src.has("output.weight") {
        single(src.projection(&[("output.weight", spec.vocab)], spec.hidden, device)?)
    } else {
        embed.as_linear()
    };
    Decoder::new(spec, (embed, input), layers, norm, lm_head, device)
}

/// Layer `i`: its mixer and its feed-forward, each loaded by its kind, and
/// the norms around them.
fn load_layer(
    src: &mut dyn WeightSource,
    spec: &ModelSpec,
    i: usize,
    device: &Device,
) -> Result<Layer> {
    let n = |t: &str| format!("blk.{i}.{t}");
    let at = (i, spec.hidden);
    let mixer = match &spec.layers[i].mixer {
        Mixer::Attention(a) => {
            MixerWeights::Attention(Box::new(attention::load::load(src, spec, (a, i), device)?))
        }
        Mixer::Latent(m) => {
            MixerWeights::Latent(Box::new(latent::load::load(src, spec, (m, i), device)?))
        }
        Mixer::Mamba2(s) => MixerWeights::Mamba2(Box::new(mamba2::load::load(src, s, at, device)?)),
        Mixer::GatedDeltaNet(g) => {
            MixerWeights::GatedDeltaNet(Box::new(gdn::load::load(src, g, at, device)?))
        }
        Mixer::ShortConv(c) => {
            MixerWeights::ShortConv(Box::new(short_conv::load::load(src, c, i, device)?))
        }
        // An encoder's weights are attention's.
        Mixer::Encoder(e) => MixerWeights::Encoder(Box::new(attention::load::load(
            src,
            spec,
            (&e.attention, i),
            device,
        )?)),
        Mixer::None => MixerWeights::None,
    };
    let ffn = load_ffn(src, spec, i, device)?;
    // (`ModelSpec::finish` refuses a layer with neither.)
    let lone = matches!(mixer, MixerWeights::None);
    // A layer of its feed-forward alone has one norm, the feed-forward's.
    let (norm, norm_bias) = match first_unnormed(src, spec, i) || lone {
        true => (None, None),
        false => block_norm(src, spec, &n("attn_norm.weight"), device)?,
    };
    let out_scale = match spec.layer_out_scale {
        true => {
            let s = src.vector(&n("layer_output_scale.weight"), 1, device)?;
            Some(f64::from(s.to_vec1::<f32>()?[0]))
        }
        false => None,
    };
    Ok(Layer {
        per_layer: PerLayerGate::load(src, spec, i, device)?,
        out_scale,
        norm,
        norm_bias,
        mixer,
        post_norm: post_norm(
            src,
            spec,
            (spec.norms.post_attention, &n("post_attention_norm.weight")),
            device,
        )?,
        ffn,
    })
}

/// Whether layer `i` has no norm before its mixer: only a pre-norm
/// model's first layer whose input the embeddings' norm already normed
/// may lack one (ModernBERT's is an identity, and stored by neither
/// checkpoints nor llama.cpp); any other missing norm stays an error.
fn first_unnormed(src: &dyn WeightSource, spec: &ModelSpec, i: usize) -> bool {
    i == 0
        && spec.input.norm
        && !spec.norms.after_residual
        && !src.has(&format!("blk.{i}.attn_norm.weight"))
}

/// Layer `i`'s feed-forward with its norms, if its kind has one.
fn load_ffn(
    src: &mut dyn WeightSource,
    spec: &ModelSpec,
    i: usize,
    device: &Device,
) -> Result<Option<FfnBlock>> {
    let n = |t: &str| format!("blk.{i}.{t}");
    let (hidden, inter) = (spec.hidden, spec.intermediate);
    let ffn = match spec.layers[i].ffn {
        FeedForward::Moe(m) => Ffn::Moe(Box::new(moe::load::load(src, &m, i, hidden, device)?)),
        FeedForward::DenseAndMoe(m) => {
            Ffn::DenseAndMoe(Box::new(DenseAndMoe::load(src, spec, (i, &m), device)?))
        }
        FeedForward::Gated(_) => {
            Ffn::Dense(mlp::load(src, i, "", (hidden, spec.ffn_width(i)), device)?)
        }
        FeedForward::Plain(_) => Ffn::Dense(mlp::load_plain(src, i, "", (hidden, inter), device)?),
        FeedForward::None => return Ok(None),
    };
    // A layer without a mixer has one norm, named as every layer's first
    // (llama.cpp's `attn_norm`, the checkpoint's `norm`).
    let norm_name = match spec.layers[i].mixer {
        Mixer::None => n("attn_norm.weight"),
        _ => n("ffn_norm.weight"),
    };
    let (norm, norm_bias) = block_norm(src, spec, &norm_name, device)?;
    Ok(Some(FfnBlock {
        norm,
        norm_bias,
        ffn,
        post_norm: post_norm(
            src,
            spec,
            (spec.norms.post_ffn, &n("post_ffw_norm.weight")),
            device,
        )?,
    }))
}

/// A block's input norm and its bias, where the family has one.
fn block_norm(
    src: &mut dyn WeightSource,
    spec: &ModelSpec,
    name: &str,
    device: &Device,
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    if !spec.norms.pre {
        return Ok((None, None));
    }
    let (w, b) = crate::norm::load(src, spec, name, spec.hidden, device)?;
    Ok((Some(w), b))
}

/// A post-norm's weight where the family has that norm (`on`).
fn post_norm(
    src: &mut dyn WeightSource,
    spec: &ModelSpec,
    (on, name): (bool, &str),
    device: &Device,
) -> Result<Option<Tensor>> {
    on.then(|| norm(src, spec, name, spec.hidden, device))
        .transpose()
}
