//! Time of one sampling call on a vocabulary-wide row, per setting:
//! `cargo run --release -p ferrox-engine --example sample_bench -- [VOCAB] [CALLS]`
//! (default 49,152, SmolLM2's vocabulary; Llama 3's is 128,256). The row is
//! fixed pseudo-random logits spread over 20 units, flatter than a trained
//! model's, so top-p keeps more tokens than it usually would.

use std::time::Instant;

use ferrox_engine::SamplingParams;
use ferrox_engine::sampler::Sampler;

fn main() {
    let arg = |i: usize, default: usize| {
        std::env::args()
            .nth(i)
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let (vocab, calls) = (arg(1, 49_152), arg(2, 400));
    let mut x: u64 = 1;
    let logits: Vec<f32> = (0..vocab)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (x >> 40) as f32 / (1u64 << 24) as f32 * 20.0 - 10.0
        })
        .collect();
    // (name, temperature, top_p, top_k, logprobs)
    let settings = [
        ("greedy", 0.0, 1.0, 0, None),
        ("temperature 1", 1.0, 1.0, 0, None),
        ("temperature 0.7, top_p 0.9", 0.7, 0.9, 0, None),
        ("top_k 50", 1.0, 1.0, 50, None),
        ("greedy, logprobs 5", 0.0, 1.0, 0, Some(5)),
    ];
    for (name, temperature, top_p, top_k, logprobs) in settings {
        let params = SamplingParams {
            temperature,
            top_p,
            top_k,
            logprobs,
            ..SamplingParams::default()
        };
        let mut sampler = Sampler::new(params, &[]);
        let start = Instant::now();
        let picked: u64 = (0..calls)
            .map(|_| u64::from(sampler.sample(&logits).id))
            .sum();
        let us = start.elapsed().as_secs_f64() * 1e6 / calls as f64;
        println!("{name}: {us:.1} us a row (vocabulary {vocab}; checksum {picked})");
    }
}
