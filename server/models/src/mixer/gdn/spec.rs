//! A Gated DeltaNet layer's kind (Qwen3-Next's and Qwen3.5's linear
//! attention): like Mamba-2, a fixed state per sequence, not KV that grows.

/// One Gated DeltaNet mixer's shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GdnSpec {
    /// Query and key heads.
    pub key_heads: usize,
    /// Value heads: a multiple of the key heads, each reading one of them.
    pub value_heads: usize,
    /// Channels of one query or key head (the state's rows).
    pub key_dim: usize,
    /// Channels of one value head (the state's columns).
    pub value_dim: usize,
    /// Width of the causal depthwise convolution over q, k and v.
    pub conv_kernel: usize,
    /// The longest run the delta rule computes as one block; longer runs
    /// carry the state between blocks (transformers' `chunk_size`, 64).
    pub chunk: usize,
    /// Value head `j` reads key head `j % key_heads` (llama.cpp's `qwen35`
    /// GGUF reorders them so); otherwise `j / (value_heads / key_heads)`,
    /// as the checkpoints have it.
    pub tiled: bool,
}

/// Larger than any model's head counts or widths: a file past it is corrupt.
const MAX_DIM: usize = 1 << 16;

impl GdnSpec {
    /// Width of the queries (or the keys) across heads.
    pub fn key_width(&self) -> usize {
        self.key_heads * self.key_dim
    }

    /// Width of the values (and the output gate) across heads.
    pub fn value_width(&self) -> usize {
        self.value_heads * self.value_dim
    }

    /// Channels of the convolution: q, k and v.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_width() + self.value_width()
    }

    /// Columns of the in-projection as the mixer reads them: q, k, v, the
    /// output gate z, then each value head's beta and decay inputs.
    pub fn in_proj(&self) -> usize {
        self.conv_dim() + self.value_width() + 2 * self.value_heads
    }

    /// Values of one sequence's state in this layer: the convolution's last
    /// `conv_kernel - 1` inputs and every value head's `key_dim x value_dim`.
    pub fn state_values(&self) -> (usize, usize) {
        (
            (self.conv_kernel - 1) * self.conv_dim(),
            self.value_heads * self.key_dim * self.value_dim,
        )
    }

    /// Checks the numbers are usable.
    pub(crate) fn validate(&self) -> std::result::Result<(), String> {
        let dims = [
            self.key_heads,
            self.value_heads,
            self.key_dim,
            self.value_dim,
            self.conv_kernel,
            self.chunk,
        ];
        if dims.iter().any(|&d| d == 0 || d > MAX_DIM) || self.conv_kernel < 2 {
            return Err(format!("unusable dimensions in {self:?}"));
        }
        if !self.value_heads.is_multiple_of(self.key_heads) {
            return Err(format!(
                "{} linear-attention value heads not a multiple of {} key heads",
                self.value_heads, self.key_heads
            ));
        }
        Ok(())
    }
}
