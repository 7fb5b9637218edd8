use half::f16;

use super::*;
use crate::test_util::{Rng, rel_err};

/// A random `rows x cols` matrix as GGUF's f16 bytes, and its values.
fn random(rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let vals: Vec<f32> = Rng::new(seed)
        .vec(rows * cols)
        .into_iter()
        .map(|v| f16::from_f32(v).to_f32())
        .collect();
    let bytes = vals
        .iter()
        .flat_map(|&v| f16::from_f32(v).to_le_bytes())
        .collect();
    (bytes, vals)
}

/// `x @ W^T` in f64.
fn reference(w: &[f32], x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let batch = x.len() / cols;
    let mut out = vec![0f32; batch * rows];
    for n in 0..batch {
        for m in 0..rows {
            let dot: f64 = (0..cols)
                .map(|k| f64::from(x[n * cols + k]) * f64::from(w[m * cols + k]))
                .sum();
            out[n * rows + m] = dot as f32;
        }
    }
    out
}

fn run(m: &HalfMatrix, kernel: Kernel, x: &[f32]) -> Vec<f32> {
    let batch = x.len() / m.cols();
    let mut out = vec![f32::NAN; batch * m.rows()];
    m.matmul_with(kernel, x, batch, &mut out).unwrap();
    out
}

#[test]
fn every_kernel_equals_the_scalar_tile_bit_for_bit_and_f64_math_closely() {
    // Shapes with a partial last block, tails of every tile width, one row;
    // batches of one and two (several blocks a tile, a short last group).
    let shapes = [
        (45, 37, 27),
        (32, 64, 1),
        (1, 8, 13),
        (70, 96, 6),
        (33, 5, 40),
        (230, 40, 1),
        (130, 24, 2),
    ];
    for (rows, cols, batch) in shapes {
        let (bytes, w) = random(rows, cols, rows as u64 * 7 + cols as u64);
        let m = HalfMatrix::new(rows, cols, &bytes).unwrap();
        let x = Rng::new(batch as u64).vec(batch * cols);
        let want = run(&m, Kernel::Scalar, &x);
        let err = rel_err(&want, &reference(&w, &x, rows, cols));
        assert!(
            err < 1e-6,
            "{rows}x{cols} batch {batch}: scalar off f64 by {err}"
        );
        for kernel in Kernel::available() {
            let got = run(&m, kernel, &x);
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{kernel:?} differs from scalar at {rows}x{cols} batch {batch}"
            );
        }
    }
}

#[test]
fn a_row_s_result_does_not_depend_on_its_batch() {
    let (rows, cols) = (40, 48);
    let (bytes, _) = random(rows, cols, 3);
    let m = HalfMatrix::new(rows, cols, &bytes).unwrap();
    let x = Rng::new(9).vec(29 * cols);
    let all = run(&m, Kernel::detect(), &x);
    for n in [0, 11, 12, 28] {
        let one = run(&m, Kernel::detect(), &x[n * cols..(n + 1) * cols]);
        assert_eq!(one, all[n * rows..(n + 1) * rows], "activation row {n}");
    }
}

#[test]
fn rows_read_back_as_stored_and_bytes_count_whole_blocks() {
    let (rows, cols) = (35, 9);
    let (bytes, w) = random(rows, cols, 5);
    let m = HalfMatrix::new(rows, cols, &bytes).unwrap();
    assert_eq!(m.held_bytes(), 64 * cols * 2);
    assert_eq!(
        HalfMatrix::held_bytes_for(rows, cols).unwrap(),
        m.held_bytes()
    );
    let mut row = vec![0f32; cols];
    for r in [0, 31, 32, 34] {
        m.dequantize_row(r, &mut row).unwrap();
        assert_eq!(row, w[r * cols..(r + 1) * cols], "row {r}");
    }
    assert_eq!(
        m.dequantize_row(rows, &mut row),
        Err(Error::RowOutOfRange { row: rows, rows })
    );
}

#[test]
fn wrong_lengths_are_refused_with_what_was_wrong() {
    let (bytes, _) = random(4, 8, 1);
    let bad = HalfMatrix::new(4, 8, &bytes[..bytes.len() - 2]).unwrap_err();
    assert!(
        matches!(
            bad,
            Error::Length {
                expected: 64,
                got: 62,
                ..
            }
        ),
        "{bad:?}"
    );
    assert!(HalfMatrix::new(0, 8, &[]).is_err());
    let m = HalfMatrix::new(4, 8, &bytes).unwrap();
    let mut out = vec![0f32; 8];
    let e = m.matmul(&[0.0; 15], 2, &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Length {
                what: "matmul input",
                ..
            }
        ),
        "{e:?}"
    );
    let e = m.matmul(&[0.0; 16], 2, &mut out[..7]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Length {
                what: "matmul output",
                ..
            }
        ),
        "{e:?}"
    );
}
