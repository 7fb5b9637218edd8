//! A short-convolution layer's kind (LFM2's `Lfm2ShortConv`): like Mamba-2,
//! a fixed state per sequence, not KV that grows; here only the
//! convolution's last `kernel - 1` inputs.

/// One short-convolution mixer's shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShortConvSpec {
    /// Channels of the convolution (the residual width).
    pub channels: usize,
    /// Taps of the causal depthwise convolution (`conv_L_cache`).
    pub kernel: usize,
    /// The in- and out-projections and the convolution have biases
    /// (`conv_bias`).
    pub bias: bool,
}

/// Larger than any model's width or kernel: a file past it is corrupt.
const MAX_DIM: usize = 1 << 20;

impl ShortConvSpec {
    /// Rows of the in-projection: the gates B and C, and the input x.
    pub fn in_proj(&self) -> usize {
        3 * self.channels
    }

    /// Values of one sequence's state in this layer: the convolution's last
    /// `kernel - 1` inputs, and no recurrent state beside them.
    pub fn state_values(&self) -> (usize, usize) {
        ((self.kernel - 1) * self.channels, 0)
    }

    /// Checks the numbers are usable.
    pub(crate) fn validate(&self) -> std::result::Result<(), String> {
        let dims = [self.channels, self.kernel];
        // One tap would hold no state, and the state helpers need one input.
        if dims.iter().any(|&d| d == 0 || d > MAX_DIM) || self.kernel < 2 {
            return Err(format!("unusable dimensions in {self:?}"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_is_the_last_inputs_and_nothing_else() {
        let s = ShortConvSpec {
            channels: 64,
            kernel: 3,
            bias: false,
        };
        assert_eq!(s.state_values(), (2 * 64, 0));
        assert_eq!(s.in_proj(), 192);
        assert!(s.validate().is_ok());
        for bad in [
            ShortConvSpec { kernel: 1, ..s },
            ShortConvSpec { channels: 0, ..s },
        ] {
            assert!(bad.validate().unwrap_err().contains("unusable"), "{bad:?}");
        }
    }
}
