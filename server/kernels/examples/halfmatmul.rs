//! f16 matmul throughput on bge-base's and Qwen3-0.6B's shapes, per
//! kernel, beside Q8_0 on the same shape (the peer the f16 file is
//! compared with): GFLOP/s, 2 a multiply-add. The f16 weights come from
//! DRAM (a copy a call, enough copies to overflow the caches).
//!
//! `cargo run --release -p ferrox-kernels --example halfmatmul -- [--batch 1,512,2048] [--secs 0.5]`

use std::time::{Duration, Instant};

use ferrox_kernels::{HalfMatrix, Kernel, QActs, QMatrix, QuantType};
use half::f16;

/// (name, rows, cols).
const SHAPES: [(&str, usize, usize); 4] = [
    ("bge qkv-o 768x768", 768, 768),
    ("bge up 3072x768", 3072, 768),
    ("bge down 768x3072", 768, 3072),
    ("qwen3-0.6B up 3072x1024", 3072, 1024),
];

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// Calls `f` for at least `secs`, returning the best calls per second of
/// three tries.
fn rate(secs: f64, mut f: impl FnMut()) -> f64 {
    f();
    (0..3)
        .map(|_| {
            let (t, mut n) = (Instant::now(), 0u32);
            while t.elapsed() < Duration::from_secs_f64(secs / 3.0) {
                f();
                n += 1;
            }
            f64::from(n) / t.elapsed().as_secs_f64()
        })
        .fold(0.0, f64::max)
}

fn main() {
    let batches: Vec<usize> = arg("--batch")
        .unwrap_or("1,512,2048".into())
        .split(',')
        .map(|b| b.parse().expect("--batch: numbers"))
        .collect();
    let secs: f64 = arg("--secs").map_or(0.6, |s| s.parse().expect("--secs: a number"));
    println!("threads {}", rayon::current_num_threads());
    for (name, rows, cols) in SHAPES {
        let vals: Vec<u8> = (0..rows * cols)
            .flat_map(|i| f16::from_f32(((i * 7919) % 1000) as f32 / 1000.0 - 0.5).to_le_bytes())
            .collect();
        // Copies enough to overflow the caches: each call reads its
        // weights from DRAM, as a short query's forward does.
        let copies = (96 << 20) / (rows * cols * 2) + 1;
        let halves: Vec<HalfMatrix> = (0..copies)
            .map(|_| HalfMatrix::new(rows, cols, &vals).expect("matrix"))
            .collect();
        let mut turn = 0;
        let q8: Vec<u8> = (0..rows * cols / 32)
            .flat_map(|b| {
                let mut block = f16::from_f32(0.01).to_le_bytes().to_vec();
                block.extend((0..32).map(|i| ((b * 31 + i * 17) % 255) as u8));
                block
            })
            .collect();
        let q8 = QMatrix::new(QuantType::Q8_0, rows, cols, q8).expect("q8");
        for &batch in &batches {
            let x: Vec<f32> = (0..batch * cols)
                .map(|i| ((i % 97) as f32 - 48.0) / 50.0)
                .collect();
            let mut out = vec![0f32; batch * rows];
            let flop = 2.0 * (batch * rows * cols) as f64;
            let mut line = format!("{name:26} batch {batch:5}");
            for kernel in Kernel::available().into_iter().skip(1) {
                let r = rate(secs, || {
                    turn = (turn + 1) % copies;
                    halves[turn]
                        .matmul_with(kernel, &x, batch, &mut out)
                        .unwrap()
                });
                line += &format!("  f16 {kernel:?} {:6.1}", r * flop / 1e9);
            }
            let mut acts = QActs::new();
            let r = rate(secs, || {
                acts.quantize(&x, batch).unwrap();
                q8.matmul_acts(&acts, &mut [&mut out], false).unwrap()
            });
            line += &format!("  Q8_0 {:6.1}", r * flop / 1e9);
            println!("{line}  GFLOP/s");
        }
    }
}
