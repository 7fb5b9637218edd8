//! The real default model (SmolLM2-135M-Instruct Q4_1) against llama.cpp.

use candle_core::Device;
use ferrox_plan::KvDtype;

use super::helpers::{Joiner, Pools, greedy_alone, greedy_batched, prefill};
use crate::fixtures::default_model;
use crate::{PagedModel, Source};

/// "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is"
pub(super) const PROMPT: [u32; 19] = [
    504, 3575, 282, 4649, 314, 7042, 30, 378, 3575, 282, 4521, 314, 11452, 30, 378, 3575, 282,
    7158, 314,
];

/// llama.cpp's greedy continuation on the same file (an independent numpy
/// implementation agrees). Past ~20 tokens this prompt has near-ties, so no further.
const REFERENCE: [u32; 20] = [
    7268, 30, 378, 3575, 282, 260, 1797, 1918, 314, 1315, 2863, 4206, 30, 198, 198, 3902, 359, 915,
    253, 1443,
];

/// The KV dtypes the CPU server holds its cache in (f16 by default).
const KV_DTYPES: [KvDtype; 3] = [KvDtype::F16, KvDtype::F32, KvDtype::Bf16];

fn real(blocks: usize, kv: KvDtype) -> Option<(PagedModel, Pools)> {
    let path = default_model()?;
    let llama = Source::open(&path).unwrap().decoder(&Device::Cpu).unwrap();
    let m = PagedModel::new(llama, blocks, 16, kv).unwrap();
    let pools = Pools::of(&m);
    Some((m, pools))
}

#[test]
fn greedy_continuation_matches_llama_cpp() {
    for kv in KV_DTYPES {
        let Some((mut m, pool)) = real(64, kv) else {
            return;
        };
        let got = greedy_alone(&mut m, &pool, &PROMPT, REFERENCE.len(), 512);
        assert_eq!(got, REFERENCE, "KV in {kv}");
        assert_eq!(pool.used(), 0);
    }
}

#[test]
fn chunked_prefill_matches_one_prefill() {
    let Some((mut m, pool)) = real(64, KvDtype::F16) else {
        return;
    };
    let prompt: Vec<u32> = PROMPT.iter().cycle().take(150).copied().collect();
    let whole = {
        let mut kv = pool.seq(prompt.len(), prompt.len());
        prefill(&mut m, &mut kv, &prompt, prompt.len())
    };
    for chunk in [1, 7, 64] {
        let mut kv = pool.seq(prompt.len(), chunk);
        let got = prefill(&mut m, &mut kv, &prompt, chunk);
        let worst = got
            .iter()
            .zip(&whole)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-3, "chunk {chunk}: max logit difference {worst}");
    }
    let whole_tokens = greedy_alone(&mut m, &pool, &prompt, 8, prompt.len());
    for chunk in [1, 7, 64] {
        assert_eq!(
            greedy_alone(&mut m, &pool, &prompt, 8, chunk),
            whole_tokens,
            "chunk {chunk}"
        );
    }
}

#[test]
fn batched_greedy_equals_each_alone() {
    for kv in [KvDtype::F16, KvDtype::F32] {
        batch_invariance(kv);
    }
}

fn batch_invariance(kv: KvDtype) {
    let Some((mut m, pool)) = real(128, kv) else {
        return;
    };
    let seqs = vec![
        Joiner {
            prompt: PROMPT.to_vec(),
            join: 0,
            n: 14,
        },
        Joiner {
            prompt: PROMPT[..7].to_vec(),
            join: 0,
            n: 5,
        },
        Joiner {
            prompt: PROMPT[3..].to_vec(),
            join: 2,
            n: 12,
        },
        Joiner {
            prompt: PROMPT.iter().rev().copied().collect(),
            join: 6,
            n: 9,
        },
    ];
    let batched = greedy_batched(&mut m, &pool, &seqs, 64);
    for (s, got) in seqs.iter().zip(&batched) {
        let alone = greedy_alone(&mut m, &pool, &s.prompt, s.n, 512);
        assert_eq!(got, &alone, "KV in {kv}");
    }
    assert_eq!(pool.used(), 0);
}

#[test]
fn candle_generic_path_matches_llama_cpp_too() {
    // Every matmul through candle's QMatMul and attention through plain
    // tensor ops: the path a non-CPU device takes.
    let Some(path) = default_model() else { return };
    let mut src = Source::open(&path).unwrap();
    if let Source::Gguf(g) = &mut src {
        g.set_packed_kernels(false);
    }
    let mut llama = src.decoder(&Device::Cpu).unwrap();
    llama.set_fused_attention(false);
    let mut m = PagedModel::new(llama, 64, 16, KvDtype::F16).unwrap();
    let pool = Pools::of(&m);
    let got = greedy_alone(&mut m, &pool, &PROMPT, REFERENCE.len(), 512);
    assert_eq!(got, REFERENCE);
}

#[test]
fn kernels_agree_with_candle_on_real_weights() {
    use candle_core::quantized::{QMatMul, gguf_file};
    use candle_core::{Module, Tensor};
    use ferrox_kernels::Kernel;
    let Some(path) = default_model() else { return };
    let mut f = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    for name in [
        "blk.0.ffn_gate.weight",
        "blk.5.attn_output.weight",
        "token_embd.weight",
        "blk.3.ffn_down.weight",
    ] {
        let q = content.tensor(&mut f, name, &Device::Cpu).unwrap();
        let (rows, cols) = q.shape().dims2().unwrap();
        let dense = q.dequantize(&Device::Cpu).unwrap();
        let raw = q.data().unwrap().to_vec();
        let ty = match q.dtype() {
            candle_core::quantized::GgmlDType::Q4_1 => ferrox_kernels::QuantType::Q4_1,
            candle_core::quantized::GgmlDType::Q8_0 => ferrox_kernels::QuantType::Q8_0,
            other => panic!("{other:?}"),
        };
        let km = ferrox_kernels::QMatrix::new(ty, rows, cols, raw).unwrap();
        for batch in [1usize, 3, 8, 9, 24] {
            let x: Vec<f32> = (0..batch * cols)
                .map(|i| {
                    ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * if i % 97 == 0 { 8.0 } else { 1.0 }
                })
                .collect();
            let xt = Tensor::from_vec(x.clone(), (batch, cols), &Device::Cpu).unwrap();
            let exact = xt
                .matmul(&dense.t().unwrap())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let cand = QMatMul::from_qtensor(content.tensor(&mut f, name, &Device::Cpu).unwrap())
                .unwrap()
                .forward(&xt)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let mut ours = vec![0f32; batch * rows];
            km.matmul(&x, batch, &mut ours).unwrap();
            // Every instruction set this CPU has (AVX2 forced even where
            // AVX-VNNI is the default) against the scalar reference.
            let mut acts = ferrox_kernels::QActs::new();
            acts.quantize(&x, batch).unwrap();
            let mut reference = vec![0f32; batch * rows];
            km.matmul_acts_with(Kernel::Scalar, &acts, &mut [&mut reference], false)
                .unwrap();
            for k in Kernel::available() {
                let mut got = vec![0f32; batch * rows];
                km.matmul_acts_with(k, &acts, &mut [&mut got], false)
                    .unwrap();
                let num: f32 = got
                    .iter()
                    .zip(&reference)
                    .map(|(a, b)| (a - b) * (a - b))
                    .sum();
                let rel = (num / reference.iter().map(|b| b * b).sum::<f32>()).sqrt();
                assert!(
                    rel < 1e-5,
                    "{name} batch {batch} {k:?}: {rel:.2e} from scalar"
                );
            }
            let err = |v: &[f32]| {
                let num: f32 = v.iter().zip(&exact).map(|(a, b)| (a - b) * (a - b)).sum();
                let den: f32 = exact.iter().map(|b| b * b).sum();
                (num / den).sqrt()
            };
            // Same activation quantisation as GGML: only summation order differs.
            let diff = {
                let num: f32 = ours.iter().zip(&cand).map(|(a, b)| (a - b) * (a - b)).sum();
                (num / exact.iter().map(|b| b * b).sum::<f32>()).sqrt()
            };
            assert!(
                diff < 2e-3,
                "{name} batch {batch}: ours vs candle {diff:.2e}"
            );
            assert!(
                err(&ours) < 1.5e-2,
                "{name} batch {batch}: {:.2e}",
                err(&ours)
            );
        }
    }
}

#[test]
fn the_default_model_holds_what_inspect_reports() {
    let Some(path) = default_model() else { return };
    let mut src = Source::open(&path).unwrap();
    let info = src.info().unwrap();
    let held = src.decoder(&Device::Cpu).unwrap().held_bytes();
    assert_eq!(info.devices.cpu.weight_bytes, held);
    // Q4_1 and Q8_0 repack to GGML's own bytes on CPU (even block counts)
    // and stay as stored on CUDA, where the Q8_0 embedding is widened to f16.
    let embed = 49_152 * 576;
    assert_eq!(
        info.devices.cuda.weight_bytes,
        info.devices.cpu.weight_bytes - embed / 32 * 34 + embed * 2
    );
    assert_eq!(info.facts.kv_dtype, KvDtype::F16);
    assert_eq!(info.devices.cpu.kv_bytes_per_token, 2 * 30 * 3 * 64 * 2);
}
