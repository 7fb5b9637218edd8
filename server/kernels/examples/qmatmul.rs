//! Quantized matmul throughput on Llama-3.2-1B's MLP shapes, per format and
//! kernel, against the machine's measured DRAM read bandwidth.
//!
//! `cargo run --release -p ferrox-kernels --example qmatmul -- [--type Q4_K,Q6_K]
//! [--kernel Avx512Vnni] [--batch 1,16,512] [--secs 0.5]`
//!
//! Batch 1 (decode) is a memory-bound job: each call reads a different
//! copy of the matrix, enough copies to overflow the caches several times,
//! so GB/s is what streaming the weights from DRAM reaches. Larger batches
//! (prefill) are compute-bound: GOPS (2 ops a multiply-add).

use std::time::{Duration, Instant};

use ferrox_kernels::{Kernel, QActs, QMatrix, QuantType};
use half::f16;
use rayon::prelude::*;

/// (name, rows, cols): gate/up and down of Llama-3.2-1B.
const SHAPES: [(&str, usize, usize); 2] = [
    ("gate 8192x2048", 8192, 2048),
    ("down 2048x8192", 2048, 8192),
];

/// Weights streamed per decode measurement: far past any L3.
const STREAM_BYTES: usize = 384 << 20;

/// xorshift64*: the benchmark needs bytes, not statistics.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Byte offsets of each GGML block's f16 scale and minimum.
fn f16_fields(ty: QuantType) -> &'static [usize] {
    match ty {
        QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Q8_0 => &[0],
        QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4_K | QuantType::Q5_K => &[0, 2],
        QuantType::Q2_K => &[80, 82],
        QuantType::Q3_K => &[108],
        QuantType::Q6_K => &[208],
        // An e8m0 byte, not an f16: set apart.
        QuantType::MXFP4 => &[],
    }
}

/// Raw GGML blocks: random quants and sub-scales, small f16 scales.
fn random_blocks(rng: &mut Rng, ty: QuantType, rows: usize, cols: usize) -> Vec<u8> {
    let bb = ty.block_bytes();
    let mut data: Vec<u8> = (0..rows * cols / ty.block_len() * bb)
        .map(|_| rng.next() as u8)
        .collect();
    for blk in data.chunks_exact_mut(bb) {
        for &at in f16_fields(ty) {
            let v = f16::from_f32(0.001 + (rng.next() % 1000) as f32 * 1e-5);
            blk[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
        if ty == QuantType::MXFP4 {
            // 2^-10..2^-3.
            blk[0] = 118 + (rng.next() % 8) as u8;
        }
    }
    data
}

/// On-CPU nanoseconds of all this process's threads, from the scheduler's
/// accounting: unlike wall time it does not grow when other jobs hold the cores.
fn cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Per call of `f` (after a warm-up, over at least `secs` and 5 calls):
/// (median wall, best wall, mean CPU time per thread) in seconds. On a
/// loaded machine the best call is the one that ran uncontended.
fn time(secs: f64, mut f: impl FnMut()) -> (f64, f64, f64) {
    f();
    let (cpu0, start) = (cpu_ns(), Instant::now());
    let mut walls = Vec::new();
    while start.elapsed() < Duration::from_secs_f64(secs) || walls.len() < 5 {
        let t = Instant::now();
        f();
        walls.push(t.elapsed().as_secs_f64());
    }
    let cpu = (cpu_ns() - cpu0) as f64 * 1e-9 / rayon::current_num_threads() as f64;
    walls.sort_by(f64::total_cmp);
    (walls[walls.len() / 2], walls[0], cpu / walls.len() as f64)
}

/// Sums `c` a cache line at a time, prefetching 4 KiB ahead as the decode
/// tiles do (the hardware prefetcher stops at page boundaries).
fn sum_lines(c: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    for (i, v) in c.chunks_exact(8).enumerate() {
        #[cfg(target_arch = "x86_64")]
        if i % 8 == 0 {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            // SAFETY: a prefetch never faults, wherever it points.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(v.as_ptr().wrapping_add(512).cast()) };
        }
        for (l, x) in lanes.iter_mut().zip(v) {
            *l = l.wrapping_add(*x);
        }
    }
    lanes.iter().fold(0u64, |a, &b| a.wrapping_add(b))
}

/// DRAM read bandwidth in GB/s, `(burst, sustained)`: every rayon thread
/// sums its share of 8 MiB (a call's worth of weights), chunk after chunk of a
/// 1 GiB buffer, far larger than the caches. Burst is the best chunk, as the
/// kernels' best call; sustained is the best of three sweeps of the whole
/// buffer, chunk by chunk, as a decode step reads every matrix in turn.
fn read_bandwidth() -> (f64, f64) {
    const CHUNK: usize = 8 << 20;
    let buf: Vec<u64> = (0..(1usize << 30) / 8).map(|i| i as u64).collect();
    let sum_chunk = |chunk: &[u64]| {
        let sum: u64 = chunk
            .par_chunks(1 << 14)
            .map(sum_lines)
            .reduce(|| 0, u64::wrapping_add);
        std::hint::black_box(sum);
    };
    let mut at = 0;
    let (_, best, _) = time(2.0, || {
        sum_chunk(&buf[at..at + CHUNK / 8]);
        at = (at + CHUNK / 8) % buf.len();
    });
    let sweep = (0..3)
        .map(|_| {
            let t = Instant::now();
            buf.chunks(CHUNK / 8).for_each(sum_chunk);
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    (
        CHUNK as f64 / best / 1e9,
        (buf.len() * 8) as f64 / sweep / 1e9,
    )
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// `--flag a,b` values, parsed by `parse`; `all` when absent.
fn list<T>(args: &[String], flag: &str, all: Vec<T>, parse: impl Fn(&str) -> Option<T>) -> Vec<T> {
    match args.iter().position(|a| a == flag) {
        Some(i) => args
            .get(i + 1)
            .map(|v| {
                v.split(',')
                    .map(|s| parse(s).unwrap_or_else(|| panic!("{flag}: unknown value {s}")))
                    .collect()
            })
            .unwrap_or_else(|| panic!("{flag} needs a value")),
        None => all,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let types = list(&args, "--type", QuantType::ALL.to_vec(), |s| {
        QuantType::ALL
            .into_iter()
            .find(|t| format!("{t:?}").eq_ignore_ascii_case(s))
    });
    // The scalar reference only when asked: it takes seconds a prefill call.
    let simd: Vec<Kernel> = Kernel::available()
        .into_iter()
        .filter(|&k| k != Kernel::Scalar)
        .collect();
    let kernels = list(&args, "--kernel", simd, |s| {
        Kernel::available()
            .into_iter()
            .find(|k| format!("{k:?}").eq_ignore_ascii_case(s))
    });
    let batches = list(&args, "--batch", vec![1, 16, 512], |s| s.parse().ok());
    let secs = list(&args, "--secs", vec![0.5], |s| s.parse().ok())[0];

    // Measured again after each format, the best kept: on a shared machine
    // the other jobs' memory traffic comes and goes.
    let (mut bw, mut sustained) = read_bandwidth();
    println!("CPU: {}", cpu_model());
    println!(
        "rayon threads: {}; kernels available: {:?} (detect: {:?})",
        rayon::current_num_threads(),
        Kernel::available(),
        Kernel::detect()
    );
    let mut rows_out = Vec::new();
    let mut rng = Rng(0x1234_5678_9ABC_DEF1);
    for &ty in &types {
        for (name, rows, cols) in SHAPES {
            let data = random_blocks(&mut rng, ty, rows, cols);
            let held = ty
                .held_bytes(rows, cols)
                .expect("benchmark shapes are valid");
            // Copies enough to stream from DRAM at batch 1.
            let copies: Vec<QMatrix> = (0..STREAM_BYTES.div_ceil(held).max(2))
                .map(|_| QMatrix::new(ty, rows, cols, data.clone()).expect("valid blocks"))
                .collect();
            for &batch in &batches {
                let x: Vec<f32> = (0..batch * cols)
                    .map(|_| (rng.next() % 2000) as f32 / 1000.0 - 1.0)
                    .collect();
                let mut acts = QActs::new();
                acts.quantize(&x, batch).expect("shape matches");
                let mut out = vec![0f32; batch * rows];
                for &k in &kernels {
                    let mut i = 0;
                    let (median, best, cpu) = time(secs, || {
                        let w = &copies[i % copies.len()];
                        i += 1;
                        w.matmul_acts_with(k, &acts, &mut [&mut out], false)
                            .expect("shapes match");
                    });
                    let gbs = held as f64 / best / 1e9;
                    let gops = 2.0 * (rows * cols * batch) as f64 / best / 1e9;
                    let row = format!(
                        "| {ty:?} | {name} | {k:?} | {batch} | {:.1} | {:.1} | {:.1} | {gbs:.1}",
                        median * 1e6,
                        best * 1e6,
                        cpu * 1e6,
                    );
                    eprintln!("{row}");
                    let cpu_gops = 2.0 * (rows * cols * batch) as f64 / cpu / 1e9;
                    rows_out.push((row, gbs, gops, cpu_gops));
                }
            }
        }
        let (b, s) = read_bandwidth();
        (bw, sustained) = (bw.max(b), sustained.max(s));
    }
    println!(
        "measured DRAM read bandwidth: {bw:.1} GB/s (best 8 MiB chunk of a 1 GiB buffer); \
         sustained {sustained:.1} GB/s (best sweep of the whole buffer)"
    );
    println!(
        "us: median and best wall time a call, CPU time a call per thread; GB/s, % of the read \
         bandwidth and GOPS (2 a multiply-add) of the best call, and GOPS of the CPU time (what \
         idle cores give a call too long to run uncontended on a shared machine)\n"
    );
    println!(
        "| type | shape | kernel | batch | median us | best us | cpu us | GB/s | % of read BW | GOPS | GOPS (cpu) |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (row, gbs, gops, cpu_gops) in rows_out {
        println!(
            "{row} | {:.0}% | {gops:.0} | {cpu_gops:.0} |",
            100.0 * gbs / bw
        );
    }
}
