//! Query temperature by position (Llama 4's attention temperature tuning,
//! which Ministral 3 shares): far positions' queries are scaled up so the
//! softmax stays sharp past the pre-training context. Each query is
//! multiplied by `1 + scale * ln(1 + floor((pos + offset) / floor))`.

use candle_core::{Device, Tensor};

use crate::error::Result;

/// One attention kind's query temperature.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueryTemperature {
    /// The log's multiplier (Ministral 3's `llama_4_scaling_beta`,
    /// llama.cpp's `attention.temperature_scale`).
    pub scale: f32,
    /// Positions per step of the floor (Ministral 3's
    /// `original_max_position_embeddings`; Llama 4's `floor_scale`).
    pub floor: usize,
    /// Added to the position first: Llama 4 counts from 1, Ministral 3
    /// from 0.
    pub offset: usize,
}

impl QueryTemperature {
    /// The factor a query at `pos` is multiplied by. The floor is taken on
    /// integers, so no rounding moves a step edge.
    pub fn factor(&self, pos: u32) -> f32 {
        let steps = (pos as usize + self.offset) / self.floor.max(1);
        1.0 + self.scale * (steps as f32).ln_1p()
    }

    /// Each token's factor, `(tokens, 1, 1)` to broadcast over a step's
    /// queries `(tokens, heads, head_dim)`.
    pub fn factors(&self, positions: &[u32], device: &Device) -> Result<Tensor> {
        let f: Vec<f32> = positions.iter().map(|&p| self.factor(p)).collect();
        Ok(Tensor::from_vec(f, (positions.len(), 1, 1), device)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_factor_steps_at_each_multiple_of_the_floor() {
        let t = QueryTemperature {
            scale: 0.1,
            floor: 16,
            offset: 0,
        };
        assert_eq!((t.factor(0), t.factor(15)), (1.0, 1.0));
        assert_eq!(t.factor(16), 1.0 + 0.1 * 2f32.ln());
        assert_eq!(t.factor(47), 1.0 + 0.1 * 3f32.ln());
        // Llama 4 counts from 1: its first step comes a position earlier.
        let llama4 = QueryTemperature { offset: 1, ..t };
        assert_eq!(llama4.factor(15), t.factor(16));
        let rows = t.factors(&[0, 16, 32], &Device::Cpu).unwrap();
        assert_eq!(rows.dims(), [3, 1, 1]);
    }
}
