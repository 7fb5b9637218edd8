//! Times the quantized matmul on SmolLM2-135M's shapes and prints the implied
//! tokens/s of the linear layers alone.
//!
//! `RAYON_NUM_THREADS=2 cargo run --release -p ferrox-kernels --example kernel_bench`

use std::time::{Duration, Instant};

use ferrox_kernels::{AttnGeometry, AttnParams, AttnSeq, QMatrix, QuantType, paged_attention};
use half::f16;

const LAYERS: f64 = 30.0;
const BATCHES: [usize; 5] = [1, 4, 16, 32, 64];

/// (name, type, rows, cols, uses per forward row)
const SHAPES: [(&str, QuantType, usize, usize, f64); 5] = [
    ("attn q/o 576x576", QuantType::Q4_1, 576, 576, 2.0 * LAYERS),
    ("attn k/v 192x576", QuantType::Q4_1, 192, 576, 2.0 * LAYERS),
    (
        "mlp gate/up 1536x576",
        QuantType::Q4_1,
        1536,
        576,
        2.0 * LAYERS,
    ),
    ("mlp down 576x1536", QuantType::Q4_1, 576, 1536, LAYERS),
    ("vocab 49152x576", QuantType::Q8_0, 49152, 576, 1.0),
];

/// Small deterministic generator; the benchmark needs bytes, not statistics.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

fn random_matrix(rng: &mut Lcg, ty: QuantType, rows: usize, cols: usize) -> QMatrix {
    let mut data = Vec::with_capacity(rows * cols / 32 * ty.block_bytes());
    for _ in 0..rows * cols / 32 {
        let start = data.len();
        data.extend_from_slice(&f16::from_f32(0.01).to_le_bytes());
        if ty == QuantType::Q4_1 {
            data.extend_from_slice(&f16::from_f32(-0.05).to_le_bytes());
        }
        while data.len() - start < ty.block_bytes() {
            data.push(rng.next() as u8);
        }
    }
    QMatrix::new(ty, rows, cols, data).expect("benchmark shapes are valid")
}

/// On-CPU nanoseconds of all this process's threads, from the scheduler's
/// accounting; unlike wall time it does not grow when other jobs hold the cores.
fn cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Mean (wall seconds, CPU seconds / threads) per call of `f`, over at least
/// 0.25 s of calls after one warm-up.
fn time(mut f: impl FnMut()) -> (f64, f64) {
    f();
    let cpu0 = cpu_ns();
    let start = Instant::now();
    let mut iters = 0u32;
    while start.elapsed() < Duration::from_millis(250) || iters < 3 {
        f();
        iters += 1;
    }
    let n = f64::from(iters);
    let threads = rayon::current_num_threads() as f64;
    let cpu = (cpu_ns() - cpu0) as f64 * 1e-9 / threads;
    (start.elapsed().as_secs_f64() / n, cpu / n)
}

/// Paged attention for SmolLM2's geometry: decode steps and one prefill
/// chunk, over f32 and f16 KV (alternated, so that drift hits both).
fn bench_attention(rng: &mut Lcg) {
    let g = AttnGeometry {
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        block_size: 16,
    };
    let params = AttnParams::causal(g.head_dim);
    let ctx = 512;
    let (seqs_n, per_seq) = (32, ctx / g.block_size);
    let cache_len = seqs_n * ctx * g.kv_heads * g.head_dim;
    let mut rand =
        |n: usize| -> Vec<f32> { (0..n).map(|_| rng.next() as f32 / 2e9 - 1.0).collect() };
    let (k, v) = (rand(cache_len), rand(cache_len));
    let to_f16 = |x: &[f32]| -> Vec<f16> { x.iter().map(|&f| f16::from_f32(f)).collect() };
    let (k16, v16) = (to_f16(&k), to_f16(&v));
    let tables: Vec<Vec<u32>> = (0..seqs_n)
        .map(|s| (0..per_seq).map(|b| (b * seqs_n + s) as u32).collect())
        .collect();
    println!(
        "
paged attention, heads 9/3 x 64, block 16 (per layer; x30 for a forward):"
    );
    let cases: [(&str, usize, usize, usize); 3] = [
        ("decode 32 seqs @ pos 511", 32, ctx - 1, 1),
        ("decode 1 seq @ pos 511", 1, ctx - 1, 1),
        ("prefill 1 seq, 256 tokens @ 256", 1, 256, 256),
    ];
    for (name, n_seqs, start_pos, n_tokens) in cases {
        let seqs: Vec<AttnSeq<'_>> = tables[..n_seqs]
            .iter()
            .map(|t| AttnSeq {
                blocks: t,
                start_pos,
                n_tokens,
            })
            .collect();
        let q = rand(n_seqs * n_tokens * g.heads * g.head_dim);
        let mut out = vec![0f32; q.len()];
        for round in 0..2 {
            let (wall32, cpu32) = time(|| {
                paged_attention(&g, &params, &q, &k, &v, &seqs, &mut out).expect("valid tables");
            });
            let (wall16, cpu16) = time(|| {
                paged_attention(&g, &params, &q, &k16, &v16, &seqs, &mut out)
                    .expect("valid tables");
            });
            println!(
                "  {name:<32} [{round}] f32 KV wall {:>8.1}us cpu {:>8.1}us | f16 KV wall {:>8.1}us cpu {:>8.1}us",
                wall32 * 1e6,
                cpu32 * 1e6,
                wall16 * 1e6,
                cpu16 * 1e6
            );
        }
    }
}

fn main() {
    let mut rng = Lcg(42);
    let threads = rayon::current_num_threads() as f64;
    println!("rayon threads: {threads}; per shape: wall us per call, GMAC/s per core of CPU time");
    let mut forward = vec![0f64; BATCHES.len()];
    let mut forward_cpu = vec![0f64; BATCHES.len()];
    for &(name, ty, rows, cols, uses) in &SHAPES {
        let w = random_matrix(&mut rng, ty, rows, cols);
        print!("{name:<22} {ty:?}");
        for (bi, &batch) in BATCHES.iter().enumerate() {
            let x: Vec<f32> = (0..batch * cols)
                .map(|_| rng.next() as f32 / 2e9 - 1.0)
                .collect();
            let mut out = vec![0f32; batch * rows];
            let (secs, cpu) = time(|| w.matmul(&x, batch, &mut out).expect("shapes match"));
            forward[bi] += uses * secs;
            forward_cpu[bi] += uses * cpu;
            // Throughput per core on the CPU time actually received.
            let gmacs = (rows * cols * batch) as f64 / cpu / 1e9 / threads;
            print!("  b{batch}: {:>8.1}us {gmacs:>5.1}", secs * 1e6);
        }
        println!();
    }
    println!("\nlinear layers only, one forward of `batch` rows");
    println!("(cpu: on-CPU time per thread, what wall time would be on idle cores)");
    for ((&batch, &secs), &cpu) in BATCHES.iter().zip(&forward).zip(&forward_cpu) {
        println!(
            "  batch {batch:>2}: wall {:>7.2} ms/forward {:>7.1} tok/s | cpu {:>7.2} ms {:>7.1} tok/s",
            secs * 1e3,
            batch as f64 / secs,
            cpu * 1e3,
            batch as f64 / cpu
        );
    }
    bench_attention(&mut rng);
}
