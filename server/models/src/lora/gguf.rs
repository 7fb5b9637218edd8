//! llama.cpp's GGUF LoRA (`convert_lora_to_gguf.py`'s output):
//! `general.type = adapter`, `adapter.type = lora`, `adapter.lora.alpha`,
//! tensors `blk.N.attn_q.weight.lora_a` `(rank, in)` and `.lora_b`
//! `(out, rank)`.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::Device;
use candle_core::quantized::gguf_file::{Content, Value};

use super::adapter::{LoraAdapter, LoraPair, LoraShapes, assemble};
use super::{Target, refuse};
use crate::error::Result;

/// `(layer, target, is_a)` of a GGUF LoRA tensor name.
fn parse_name(tensor: &str) -> Option<(usize, Target, bool)> {
    let rest = tensor.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let (stem, which) = tail
        .strip_suffix(".weight.lora_a")
        .map(|s| (s, true))
        .or_else(|| tail.strip_suffix(".weight.lora_b").map(|s| (s, false)))?;
    Some((layer.parse().ok()?, Target::from_gguf(stem)?, which))
}

fn text<'a>(md: &'a std::collections::HashMap<String, Value>, key: &str) -> Option<&'a str> {
    md.get(key)
        .and_then(|v| v.to_string().ok())
        .map(String::as_str)
}

/// llama.cpp's converter interleaves the two halves of each head's q/k
/// rows (as the base loader's `unpermute_rows` undoes for the weights):
/// HF row `h*d + j*d/2 + i` is GGUF row `h*d + 2i + j`.
pub(super) fn unpermute(b: &[f32], rank: usize, heads: usize) -> Option<Vec<f32>> {
    let rows = b.len() / rank.max(1);
    if heads == 0 || !rows.is_multiple_of(2 * heads) {
        return None;
    }
    let d = rows / heads;
    let mut out = vec![0f32; b.len()];
    for h in 0..heads {
        for j in 0..2 {
            for i in 0..d / 2 {
                let (dst, src) = (h * d + j * (d / 2) + i, h * d + 2 * i + j);
                out[dst * rank..(dst + 1) * rank].copy_from_slice(&b[src * rank..(src + 1) * rank]);
            }
        }
    }
    Some(out)
}

/// Reads one tensor as f32, refusing one the file is too short for.
fn read_f32(
    name: &str,
    content: &Content,
    reader: &mut BufReader<File>,
    file_size: u64,
    tensor: &str,
) -> Result<(Vec<usize>, Vec<f32>)> {
    let info = &content.tensor_infos[tensor];
    let dims = info.shape.dims().to_vec();
    let (ty, n) = (info.ggml_dtype, info.shape.elem_count());
    let size = (n / ty.block_size()).checked_mul(ty.type_size());
    let end = size.and_then(|s| {
        (content.tensor_data_offset)
            .checked_add(info.offset)?
            .checked_add(s as u64)
    });
    if end.is_none_or(|e| e > file_size) {
        return Err(refuse(
            name,
            format!("truncated file: tensor {tensor} runs past its end ({file_size} bytes)"),
        ));
    }
    let q = content
        .tensor(reader, tensor, &Device::Cpu)
        .map_err(|e| refuse(name, format!("tensor {tensor}: {e}")))?;
    let v = q
        .dequantize(&Device::Cpu)
        .and_then(|t| t.flatten_all()?.to_vec1::<f32>())
        .map_err(|e| refuse(name, format!("tensor {tensor}: {e}")))?;
    Ok((dims, v))
}

/// Loads the GGUF LoRA file at `path` as `name`, checked against `shapes`.
pub fn load_gguf(name: &str, path: &Path, shapes: &LoraShapes) -> Result<LoraAdapter> {
    let file = File::open(path).map_err(|e| refuse(name, format!("{}: {e}", path.display())))?;
    let file_size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut reader = BufReader::new(file);
    let header = crate::gguf_header::read(&mut reader).map_err(|e| {
        refuse(
            name,
            format!("{}: not a readable GGUF file: {e}", path.display()),
        )
    })?;
    if let Some(t) = header.mxfp4.iter().next() {
        return Err(refuse(
            name,
            format!("tensor {t}: an adapter in MXFP4 is not read"),
        ));
    }
    let content = header.content;
    let md = &content.metadata;
    let (kind, adapter) = (text(md, "general.type"), text(md, "adapter.type"));
    if kind != Some("adapter") || adapter != Some("lora") {
        return Err(refuse(
            name,
            format!(
                "{}: not a GGUF LoRA (general.type {kind:?}, adapter.type {adapter:?})",
                path.display()
            ),
        ));
    }
    let alpha = md
        .get("adapter.lora.alpha")
        .and_then(|v| v.to_f32().ok())
        .unwrap_or(0.0);
    let mut halves: BTreeMap<(usize, Target), [Option<String>; 2]> = BTreeMap::new();
    for tensor in content.tensor_infos.keys() {
        let (layer, target, is_a) = parse_name(tensor)
            .ok_or_else(|| refuse(name, format!("unknown target: tensor {tensor}")))?;
        halves.entry((layer, target)).or_default()[usize::from(!is_a)] = Some(tensor.clone());
    }
    let mut pairs = Vec::with_capacity(halves.len());
    for ((layer, target), [a, b]) in halves {
        let what = format!("blk.{layer}.{}", target.gguf());
        let (Some(a), Some(b)) = (a, b) else {
            return Err(refuse(
                name,
                format!("{what} has only one of lora_a, lora_b"),
            ));
        };
        let (a_dims, a) = read_f32(name, &content, &mut reader, file_size, &a)?;
        let (b_dims, mut b) = read_f32(name, &content, &mut reader, file_size, &b)?;
        let (&[rank, _], &[rows, b_rank]) = (a_dims.as_slice(), b_dims.as_slice()) else {
            return Err(refuse(
                name,
                format!("{what}: lora_a and lora_b must be matrices"),
            ));
        };
        if b_rank != rank {
            return Err(refuse(
                name,
                format!("{what}: lora_a has rank {rank}, lora_b {b_rank}"),
            ));
        }
        if let Some((heads, kv_heads)) = shapes.gguf_unpermute {
            let heads = match target {
                Target::Q => Some(heads),
                Target::K => Some(kv_heads),
                _ => None,
            };
            if let Some(h) = heads {
                b = unpermute(&b, rank, h).ok_or_else(|| {
                    refuse(
                        name,
                        format!("{what}: {rows} rows do not split into {h} heads"),
                    )
                })?;
            }
        }
        // llama.cpp: scale = alpha / rank, or 1 without an alpha.
        let scale = if alpha == 0.0 {
            1.0
        } else {
            alpha / rank as f32
        };
        let pair = LoraPair::new(&a, &b, rank, rows, scale)
            .ok_or_else(|| refuse(name, format!("{what}: empty, or values past f16's range")))?;
        pairs.push((layer, target, pair));
    }
    assemble(name, shapes, pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse() {
        assert_eq!(
            parse_name("blk.2.attn_q.weight.lora_a"),
            Some((2, Target::Q, true))
        );
        assert_eq!(
            parse_name("blk.0.ffn_down.weight.lora_b"),
            Some((0, Target::Down, false))
        );
        for bad in [
            "token_embd.weight.lora_a",
            "blk.1.attn_q.weight",
            "blk.1.ssm_in.weight.lora_a",
        ] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn unpermute_inverts_llama_cpp_interleaving() {
        // 1 head of 4 rows, rank 1: GGUF rows [0, 2, 1, 3] of HF order.
        let gguf = [0.0, 2.0, 1.0, 3.0];
        assert_eq!(unpermute(&gguf, 1, 1), Some(vec![0.0, 1.0, 2.0, 3.0]));
        assert_eq!(unpermute(&[0.0; 6], 1, 2), None);
    }
}
