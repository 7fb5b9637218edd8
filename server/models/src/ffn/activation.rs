//! An MLP's activation: a dense layer's, its experts', or an encoder's
//! plain MLP's.

/// An MLP's activation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// SiLU (SwiGLU: Llama, Qwen, Mistral, Phi).
    Silu,
    /// GELU, tanh approximation (GeGLU: Gemma).
    GeluTanh,
    /// GELU, exact (erf): BERT's `gelu`.
    Gelu,
    /// gpt-oss's clamped SwiGLU: the gate clamped above at `limit`, up to
    /// `[-limit, limit]`, then `(up + 1) * gate * sigmoid(alpha * gate)`.
    SwigluOai {
        /// The sigmoid's slope (1.702).
        alpha: f32,
        /// The clamp (7.0).
        limit: f32,
    },
}
