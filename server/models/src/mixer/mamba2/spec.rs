//! A recurrent (state-space) layer's kind: Mamba-2's SSD mixer, whose
//! memory per sequence is a fixed state, not KV that grows.

/// One Mamba-2 mixer's shape and constants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SsmSpec {
    /// SSM heads.
    pub heads: usize,
    /// Channels of one head (`heads * head_dim` is the inner width).
    pub head_dim: usize,
    /// State size `N` of each head's `head_dim x N` state.
    pub state: usize,
    /// Groups sharing one B and one C (grouped like GQA's KV heads).
    pub groups: usize,
    /// Width of the causal depthwise convolution.
    pub conv_kernel: usize,
    /// The longest run the scan computes as one quadratic block (the
    /// model's `chunk_size`); longer runs carry the state between blocks.
    pub chunk: usize,
    /// The time step is clamped to `[lo, hi]` after its softplus.
    pub dt_limit: (f32, f32),
    /// The convolution has a bias.
    pub conv_bias: bool,
    /// The in- and out-projections have biases.
    pub proj_bias: bool,
}

/// Larger than any model's state or head counts: a file past it is corrupt.
const MAX_DIM: usize = 1 << 16;

impl SsmSpec {
    /// Width of the gated, normed output (`heads * head_dim`).
    pub fn inner(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Channels of the convolution: x, B and C.
    pub fn conv_dim(&self) -> usize {
        self.inner() + 2 * self.groups * self.state
    }

    /// Rows of the in-projection: the gate z, x, B, C and the time steps.
    pub fn in_proj(&self) -> usize {
        self.inner() + self.conv_dim() + self.heads
    }

    /// Values of one sequence's state in this layer: the convolution's last
    /// `conv_kernel - 1` inputs and every head's `head_dim x state`.
    pub fn state_values(&self) -> (usize, usize) {
        (
            (self.conv_kernel - 1) * self.conv_dim(),
            self.heads * self.head_dim * self.state,
        )
    }

    /// Checks the numbers are usable.
    pub(crate) fn validate(&self) -> std::result::Result<(), String> {
        let dims = [
            self.heads,
            self.head_dim,
            self.state,
            self.groups,
            self.conv_kernel,
            self.chunk,
        ];
        if dims.iter().any(|&d| d == 0 || d > MAX_DIM) || self.conv_kernel < 2 {
            return Err(format!("unusable dimensions in {self:?}"));
        }
        if !self.heads.is_multiple_of(self.groups) {
            return Err(format!(
                "{} SSM heads not a multiple of {} groups",
                self.heads, self.groups
            ));
        }
        let (lo, hi) = self.dt_limit;
        if lo.is_nan() || hi.is_nan() || lo < 0.0 || lo > hi {
            return Err(format!("time step limit [{lo}, {hi}]"));
        }
        Ok(())
    }
}
