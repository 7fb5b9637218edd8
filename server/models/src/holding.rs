//! How each weight tensor is held on each device: the one decision both the
//! loaders follow and `inspect` counts, so the weight bytes the plan sees are
//! the bytes the server allocates there.
//!
//! On CPU the decoder computes in f32: a GGUF's f16 matrices are kept f16
//! for ferrox-kernels' f16 matmul (widened in registers), other float
//! matrices are widened to f32, every block type ferrox-kernels runs
//! (Q4_0..Q8_0, Q2_K..Q6_K, MXFP4) is repacked for them (matrices and
//! embedding tables alike: a table is dequantized a row at a time on
//! lookup), other quantized matrices stay as stored (candle's). On CUDA float weights stay in the dtype they are
//! stored in (bf16/f16 through cuBLAS), quantized matrices stay quantized
//! (MXFP4 as the Q5_0 it is transcoded to without loss: candle has no MXFP4
//! kernels) and a quantized embedding table is widened to f16.

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device};
use ferrox_kernels::{HalfMatrix, QuantType};
use ferrox_plan::DeviceKind;

/// What a tensor is to the decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A weight matrix applied to activations (projections, the LM head).
    Matrix,
    /// The token embedding table.
    Embedding,
    /// A norm weight or a bias.
    Vector,
    /// A mixture of experts' router (or a shared expert's gate): small,
    /// and held in f32 on every device, so the experts a token gets never
    /// turn on half-precision rounding (llama.cpp keeps it f32 too).
    Router,
}

/// GGUF tensors held as [`Role::Router`].
const ROUTERS: [&str; 2] = ["ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight"];

impl Role {
    /// The role of the GGUF tensor `name` with `dims`.
    pub fn of(name: &str, dims: usize) -> Role {
        match (name, dims) {
            ("token_embd.weight", _) => Role::Embedding,
            _ if ROUTERS.iter().any(|r| name.ends_with(r)) => Role::Router,
            // Stacked expert biases are 2-D.
            _ if name.ends_with(".bias") => Role::Vector,
            (_, 0 | 1) => Role::Vector,
            _ => Role::Matrix,
        }
    }
}

/// How one tensor is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// Repacked for ferrox-kernels (CPU).
    Packed(QuantType),
    /// In its stored block-quantized form (candle's quantized tensors).
    Quantized,
    /// As f16 for ferrox-kernels' f16 matmul (CPU).
    Half,
    /// As floats of this dtype.
    Float(DType),
}

impl Held {
    /// Bytes a tensor of `dims` (outermost first) takes: the repacked size,
    /// `stored` as quantized, else its elements in its dtype.
    pub fn bytes(self, dims: &[usize], stored: usize) -> u64 {
        // A corrupt header's sizes saturate; loading refuses such a tensor.
        let Some(elems) = elem_count(dims) else {
            return u64::MAX;
        };
        match self {
            Held::Packed(_) | Held::Half => {
                // Stacked experts `[experts, rows, cols]` are packed one
                // expert at a time.
                let (cols, rows) = match dims {
                    [.., r, c] => (*c, *r),
                    [c] => (*c, 1),
                    [] => (0, 0),
                };
                let matrices = elem_count(&dims[..dims.len().saturating_sub(2)]).unwrap_or(0);
                let one = match self {
                    Held::Packed(ty) => ty.held_bytes(rows, cols),
                    _ => HalfMatrix::held_bytes_for(rows, cols),
                };
                one.ok()
                    .and_then(|b| b.checked_mul(matrices))
                    .unwrap_or(stored) as u64
            }
            Held::Quantized => stored as u64,
            Held::Float(dt) => (elems as u64).saturating_mul(dt.size_in_bytes() as u64),
        }
    }
}

/// Elements of a tensor of `dims`, if the product fits.
pub fn elem_count(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

/// The device kind of a candle device (Metal counts as a GPU).
pub fn device_kind(device: &Device) -> DeviceKind {
    if device.is_cpu() {
        DeviceKind::Cpu
    } else {
        DeviceKind::Cuda
    }
}

/// The GGML types ferrox-kernels run (on CPU).
pub fn kernel_type(dtype: GgmlDType) -> Option<QuantType> {
    match dtype {
        GgmlDType::Q4_0 => Some(QuantType::Q4_0),
        GgmlDType::Q4_1 => Some(QuantType::Q4_1),
        GgmlDType::Q5_0 => Some(QuantType::Q5_0),
        GgmlDType::Q5_1 => Some(QuantType::Q5_1),
        GgmlDType::Q8_0 => Some(QuantType::Q8_0),
        GgmlDType::Q2K => Some(QuantType::Q2_K),
        GgmlDType::Q3K => Some(QuantType::Q3_K),
        GgmlDType::Q4K => Some(QuantType::Q4_K),
        GgmlDType::Q5K => Some(QuantType::Q5_K),
        GgmlDType::Q6K => Some(QuantType::Q6_K),
        _ => None,
    }
}

/// How a GGUF tensor of `dtype` in `role` is held on `device`, with
/// ferrox-kernels on CPU (the server's way).
pub fn gguf(role: Role, dtype: GgmlDType, device: DeviceKind) -> Held {
    let float = matches!(dtype, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16);
    match (device, role, kernel_type(dtype)) {
        (_, Role::Vector | Role::Router, _) => Held::Float(DType::F32),
        (DeviceKind::Cpu, _, Some(ty)) => Held::Packed(ty),
        (DeviceKind::Cpu, Role::Matrix, None) if dtype == GgmlDType::F16 => Held::Half,
        (DeviceKind::Cpu, Role::Matrix, None) if !float => Held::Quantized,
        (DeviceKind::Cpu, _, _) => Held::Float(DType::F32),
        // candle looks embeddings up in dense tables: half of f32's bytes.
        (DeviceKind::Cuda, Role::Embedding, _) if !float => Held::Float(DType::F16),
        (DeviceKind::Cuda, _, _) if !float => Held::Quantized,
        (DeviceKind::Cuda, _, _) => Held::Float(float_dtype(dtype)),
    }
}

/// How a GGUF tensor stored as MXFP4 (GGML type 39) in `role` is held on
/// `device`: packed as MXFP4 on CPU, as its Q5_0 transcoding on CUDA.
pub fn gguf_mxfp4(role: Role, device: DeviceKind) -> Held {
    match (device, role) {
        (_, Role::Vector | Role::Router) => Held::Float(DType::F32),
        (DeviceKind::Cpu, _) => Held::Packed(QuantType::MXFP4),
        (DeviceKind::Cuda, _) => gguf(role, GgmlDType::Q5_0, device),
    }
}

/// The candle dtype of a float GGML type (f32 for any other).
fn float_dtype(dtype: GgmlDType) -> DType {
    match dtype {
        GgmlDType::F16 => DType::F16,
        GgmlDType::BF16 => DType::BF16,
        _ => DType::F32,
    }
}

/// The dtype a safetensors tensor stored as `stored` is held in on `device`:
/// matrices in the dtype the device computes them in, vectors (norms, biases)
/// in f32, the residual stream's dtype.
pub fn safetensors(role: Role, stored: DType, device: DeviceKind) -> DType {
    match (role, device) {
        (Role::Vector | Role::Router, _) | (_, DeviceKind::Cpu) => DType::F32,
        (_, DeviceKind::Cuda) => stored,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_device_holds_what_it_computes_in() {
        use DeviceKind::{Cpu, Cuda};
        let f32 = Held::Float(DType::F32);
        let cases = [
            (
                Role::Matrix,
                GgmlDType::Q4_1,
                Cpu,
                Held::Packed(QuantType::Q4_1),
            ),
            (
                Role::Matrix,
                GgmlDType::Q6K,
                Cpu,
                Held::Packed(QuantType::Q6_K),
            ),
            (
                Role::Matrix,
                GgmlDType::Q5_0,
                Cpu,
                Held::Packed(QuantType::Q5_0),
            ),
            (Role::Matrix, GgmlDType::Q8_1, Cpu, Held::Quantized),
            (Role::Matrix, GgmlDType::F16, Cpu, Held::Half),
            (Role::Matrix, GgmlDType::BF16, Cpu, f32),
            (Role::Embedding, GgmlDType::F16, Cpu, f32),
            (
                Role::Embedding,
                GgmlDType::Q8_0,
                Cpu,
                Held::Packed(QuantType::Q8_0),
            ),
            (
                Role::Embedding,
                GgmlDType::Q6K,
                Cpu,
                Held::Packed(QuantType::Q6_K),
            ),
            // A float table is widened: as a tied LM head it is a CPU matmul in f32.
            (Role::Embedding, GgmlDType::BF16, Cpu, f32),
            (Role::Vector, GgmlDType::F32, Cpu, f32),
            (Role::Matrix, GgmlDType::Q4K, Cuda, Held::Quantized),
            (
                Role::Matrix,
                GgmlDType::BF16,
                Cuda,
                Held::Float(DType::BF16),
            ),
            (
                Role::Embedding,
                GgmlDType::F16,
                Cuda,
                Held::Float(DType::F16),
            ),
            (
                Role::Embedding,
                GgmlDType::Q4K,
                Cuda,
                Held::Float(DType::F16),
            ),
            (Role::Vector, GgmlDType::F16, Cuda, f32),
        ];
        for (role, dtype, device, want) in cases {
            assert_eq!(
                gguf(role, dtype, device),
                want,
                "{role:?} {dtype:?} {device}"
            );
        }
        let mx = [
            (Role::Matrix, Cpu, Held::Packed(QuantType::MXFP4)),
            (Role::Embedding, Cpu, Held::Packed(QuantType::MXFP4)),
            (Role::Matrix, Cuda, Held::Quantized),
            (Role::Embedding, Cuda, Held::Float(DType::F16)),
            (Role::Vector, Cpu, f32),
            (Role::Router, Cuda, f32),
        ];
        for (role, device, want) in mx {
            assert_eq!(gguf_mxfp4(role, device), want, "MXFP4 {role:?} {device}");
        }
        assert_eq!(safetensors(Role::Matrix, DType::BF16, Cpu), DType::F32);
        assert_eq!(safetensors(Role::Matrix, DType::BF16, Cuda), DType::BF16);
        assert_eq!(safetensors(Role::Embedding, DType::F16, Cuda), DType::F16);
        assert_eq!(safetensors(Role::Vector, DType::BF16, Cuda), DType::F32);
    }

    #[test]
    fn bytes_follow_the_holding() {
        assert_eq!(Held::Quantized.bytes(&[2, 32], 36), 36);
        // Rows round up to a whole group of 8 (the repacked layout's).
        assert_eq!(Held::Packed(QuantType::Q4_1).bytes(&[1, 32], 20), 160);
        assert_eq!(Held::Packed(QuantType::Q8_0).bytes(&[2, 32], 68), 272);
        assert_eq!(Held::Packed(QuantType::Q8_0).bytes(&[16, 64], 1088), 1088);
        assert_eq!(Held::Float(DType::F32).bytes(&[2, 32], 36), 256);
        assert_eq!(Held::Float(DType::BF16).bytes(&[64], 128), 128);
        // f16 rows round up to a whole block of 32, per expert.
        assert_eq!(Held::Half.bytes(&[40, 8], 640), 64 * 8 * 2);
        assert_eq!(Held::Half.bytes(&[3, 32, 8], 1536), 1536);
        assert_eq!(Role::of("token_embd.weight", 2), Role::Embedding);
        assert_eq!(Role::of("blk.0.attn_norm.weight", 1), Role::Vector);
        assert_eq!(Role::of("output.weight", 2), Role::Matrix);
        assert_eq!(Role::of("blk.3.ffn_gate_inp.weight", 2), Role::Router);
        assert_eq!(Role::of("blk.3.ffn_gate_inp_shexp.weight", 2), Role::Router);
        assert_eq!(Role::of("blk.3.ffn_gate_exps.bias", 2), Role::Vector);
        assert_eq!(
            gguf(Role::Router, GgmlDType::BF16, DeviceKind::Cuda),
            Held::Float(DType::F32)
        );
        // Stacked experts are packed one at a time: 4 experts of 12 rows
        // each round up to 16 rows.
        let one = QuantType::Q8_0.held_bytes(12, 64).unwrap() as u64;
        assert_eq!(
            Held::Packed(QuantType::Q8_0).bytes(&[4, 12, 64], 0),
            4 * one
        );
    }
}
