//! The answer of `POST /v1/embeddings` in OpenAI's shape: each vector cut
//! to the asked dimensions, normalized, and written as floats or base64.

use ferrox_models::pooling::normalize;
use serde::Serialize;

use crate::openai::embeddings::{Encoding, Finish};

/// `POST /v1/embeddings`' answer.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct EmbeddingResponse {
    /// `embd-...`.
    pub id: String,
    /// Always `list`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model that answered.
    pub model: String,
    /// One vector per input, in input order.
    pub data: Vec<EmbeddingData>,
    /// Token counts.
    pub usage: EmbeddingUsage,
}

/// One input's vector.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct EmbeddingData {
    /// Always `embedding`.
    pub object: &'static str,
    /// The input's index.
    pub index: usize,
    /// Floats, or base64 of their little-endian f32 bytes.
    #[schema(value_type = serde_json::Value)]
    pub embedding: Vector,
}

/// A vector as written.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Vector {
    /// JSON numbers.
    Floats(Vec<f32>),
    /// Base64 of the little-endian f32 bytes.
    Base64(String),
}

/// The tokens an embedding request used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct EmbeddingUsage {
    /// Every input's tokens.
    pub prompt_tokens: usize,
    /// The same: nothing is generated.
    pub total_tokens: usize,
}

/// `v` finished as a request asked: cut, normalized, written.
pub fn finish(mut v: Vec<f32>, f: &Finish) -> Vector {
    if let Some(d) = f.dimensions {
        v.truncate(d);
    }
    if f.normalize {
        normalize(&mut v);
    }
    match f.encoding {
        Encoding::Float => Vector::Floats(v),
        Encoding::Base64 => {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            Vector::Base64(base64(&bytes))
        }
    }
}

/// Standard base64 (RFC 4648, padded), as OpenAI's clients decode it.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_rfc_4648() {
        for (bytes, want) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foobar", "Zm9vYmFy"),
            (&[0xff, 0xfe, 0x00], "//4A"),
        ] {
            assert_eq!(base64(bytes), want);
        }
    }

    #[test]
    fn a_vector_is_cut_then_normalized_then_written() {
        let f = |dimensions, normalize, encoding| Finish {
            dimensions,
            normalize,
            encoding,
        };
        let v = vec![3.0, 4.0, 12.0];
        let cases = [
            (
                f(None, false, Encoding::Float),
                Vector::Floats(vec![3.0, 4.0, 12.0]),
            ),
            (
                f(Some(2), true, Encoding::Float),
                Vector::Floats(vec![0.6, 0.8]),
            ),
            (
                f(Some(1), false, Encoding::Base64),
                Vector::Base64(base64(&3.0f32.to_le_bytes())),
            ),
        ];
        for (fin, want) in cases {
            assert_eq!(finish(v.clone(), &fin), want, "{fin:?}");
        }
    }
}
