//! Quantized weight matrices, repacked at load from GGML blocks into the
//! layout the tiles read.

use half::f16;
use rayon::prelude::*;

use crate::Error;
use crate::ggml_block::{Decoded, decode};
use crate::layout::Layout;
use crate::quant_type::{E2M1, Format, GROUP, Min, QK, QuantType, Sub, e8m0_half};

/// A quantized weight matrix, `rows` output features by `cols` input features.
///
/// Repacked on construction, once, for the tiles (see [`Layout`]: rows in
/// groups of 8, the last padded with zero rows, groups in panels of 2).
/// Quants are bit planes: a 32-block of a group is `lo + hi` registers of
/// 32 bytes, 4 bytes a row (see [`Format::bits`]: the legacy 4-bit formats
/// keep GGML's 16 bytes a row, byte `j` holding weight `j` low and `j + 16`
/// high); 5- and 6-bit quants add a 1- or 2-bit plane rather than widening
/// to bytes. Unpacked, register `u` holds weights `4u..4u+4` of each row in
/// its lanes, so against the activation's same 4 bytes broadcast one
/// `maddubs`/`vpdpbusd` gives every row's partial dot, with no horizontal
/// sums. Scales sit beside the quants per panel: f16 `d` (and `m`: Q4_1/Q5_1's
/// minimum, the K-quants' `dmin`) per GGML block, and two sub-scale bytes
/// per 32-block (K-quants); MXFP4 keeps its e8m0 byte instead of an f16
/// (its codes are held as Q4_0's nibbles). The bytes held are
/// [`QuantType::held_bytes`].
#[derive(Debug, Clone)]
pub struct QMatrix {
    ty: QuantType,
    rows: usize,
    cols: usize,
    /// Quant plane registers, `[panel][block][register][group][row][4]`.
    pub(crate) qs: Vec<u8>,
    /// f16 bits of each GGML block's scale, `[panel][block][group][row]`.
    pub(crate) d: Vec<u16>,
    /// f16 bits of each GGML block's minimum (`Min::None`: empty), as `d`.
    pub(crate) m: Vec<u16>,
    /// MXFP4's e8m0 scale bytes, as `d` (which it leaves empty); else empty.
    pub(crate) e: Vec<u8>,
    /// Sub-scale bytes (`Sub::None`: empty), two a row a 32-block.
    pub(crate) sc: Vec<u8>,
}

/// One panel's share of each array.
struct PanelMut<'a> {
    qs: &'a mut [u8],
    d: &'a mut [u16],
    m: &'a mut [u16],
    e: &'a mut [u8],
    sc: &'a mut [u8],
}

impl QMatrix {
    /// Builds a matrix from raw GGML block bytes (`rows` rows of `cols`
    /// weights, row-major), checking their length.
    pub fn new(ty: QuantType, rows: usize, cols: usize, data: Vec<u8>) -> Result<Self, Error> {
        ty.held_bytes(rows, cols)?;
        let expected = rows
            .checked_mul(cols / ty.block_len())
            .and_then(|n| n.checked_mul(ty.block_bytes()))
            .ok_or(Error::Overflow("weight bytes"))?;
        if data.len() != expected {
            return Err(Error::Length {
                what: "weight data",
                expected,
                got: data.len(),
            });
        }
        let f = ty.format();
        let lay = Layout::new(rows);
        let slots = lay.groups() * GROUP;
        let (nb, units) = (cols / QK, cols / ty.block_len());
        // Exactly `held_bytes`, whose checked sum these products stay under.
        let m_len = if f.min == Min::None { 0 } else { slots * units };
        let (d_len, e_len) = if f.mx {
            (0, slots * units)
        } else {
            (slots * units, 0)
        };
        let sc_len = if f.sub == Sub::None {
            0
        } else {
            slots * nb * 2
        };
        let mut w = Self {
            ty,
            rows,
            cols,
            qs: vec![0; slots * nb * f.regs() * 4],
            d: vec![0; d_len],
            m: vec![0; m_len],
            e: vec![0; e_len],
            sc: vec![0; sc_len],
        };
        let lens = [
            Layout::panel_len(nb, f.regs()) * 4,
            Layout::panel_len(units, 1),
            Layout::panel_len(units, 1),
            Layout::panel_len(nb, 2),
        ];
        let (mut qs, mut d, mut m, mut e, mut sc) = (
            &mut w.qs[..],
            &mut w.d[..],
            &mut w.m[..],
            &mut w.e[..],
            &mut w.sc[..],
        );
        let mut panels = Vec::with_capacity(lay.groups().div_ceil(2));
        while !qs.is_empty() {
            panels.push(PanelMut {
                qs: split_off(&mut qs, lens[0]),
                d: split_off(&mut d, lens[1]),
                m: split_off(&mut m, lens[2]),
                e: split_off(&mut e, lens[1]),
                sc: split_off(&mut sc, lens[3]),
            });
        }
        let fill =
            |(p, panel): (usize, PanelMut<'_>)| fill_panel(ty, lay, (rows, cols), &data, p, panel);
        panels.into_par_iter().enumerate().for_each(fill);
        Ok(w)
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The block format.
    pub fn quant_type(&self) -> QuantType {
        self.ty
    }

    /// Bytes the weights occupy (equals [`QuantType::held_bytes`]).
    pub fn held_bytes(&self) -> usize {
        self.qs.capacity()
            + self.sc.capacity()
            + self.e.capacity()
            + (self.d.capacity() + self.m.capacity()) * 2
    }

    /// Where row groups sit.
    pub(crate) fn layout(&self) -> Layout {
        Layout::new(self.rows)
    }

    /// 32-blocks per row.
    pub(crate) fn blocks_per_row(&self) -> usize {
        self.cols / QK
    }

    /// Row groups, the last padded.
    pub(crate) fn groups(&self) -> usize {
        self.layout().groups()
    }

    /// The stored quants of 32-block `b` of `row` (Q8_0: its i8 bits).
    pub(crate) fn block_quants(&self, row: usize, b: usize) -> [u8; QK] {
        let (f, lay, nb) = (self.ty.format(), self.layout(), self.blocks_per_row());
        let (g, r) = (row / GROUP, row % GROUP);
        // The row's 4 bytes of each plane register, then each weight's bits.
        let mut regs = [0u32; 8];
        for (k, reg) in regs.iter_mut().enumerate().take(f.regs()) {
            let at = 4 * (lay.index(g, b, nb, k, f.regs()) + r);
            *reg = u32::from_le_bytes([
                self.qs[at],
                self.qs[at + 1],
                self.qs[at + 2],
                self.qs[at + 3],
            ]);
        }
        std::array::from_fn(|k| {
            let [(lr, ls), (hr, hs)] = f.bits(k);
            let byte = |reg: usize, shift: u32| (regs[reg] >> (8 * (k % 4) as u32 + shift)) & 0xFF;
            let low = byte(lr, ls) & ((1 << f.lo) - 1);
            let high = if f.hi == 0 {
                0
            } else {
                byte(hr, hs) & ((1 << f.hi) - 1)
            };
            (low | (high << f.lo)) as u8
        })
    }

    /// The two sub-scale bytes of 32-block `b` of `row` (`[0, 0]` without).
    pub(crate) fn block_sub(&self, row: usize, b: usize) -> [u8; 2] {
        let (f, lay, nb) = (self.ty.format(), self.layout(), self.blocks_per_row());
        let (g, r) = (row / GROUP, row % GROUP);
        match f.sub {
            Sub::None => [0, 0],
            Sub::Per32 => [0, 1].map(|fi| self.sc[lay.index(g, b, nb, fi, 2) + r]),
            Sub::Per16 | Sub::Per16Min => {
                let at = 2 * (lay.index(g, b, nb, 0, 1) + r);
                [self.sc[at], self.sc[at + 1]]
            }
        }
    }

    /// `(d, m)` of the GGML block holding 32-block `b` of `row`, as f32
    /// (`m` is 0 for formats without a minimum).
    pub(crate) fn unit_scales(&self, row: usize, b: usize) -> (f32, f32) {
        let f = self.ty.format();
        let units = self.cols / self.ty.block_len();
        let at = self.layout().index(row / GROUP, b / f.bpu, units, 0, 1) + row % GROUP;
        let m = self.m.get(at).map_or(0.0, |&m| f16::from_bits(m).to_f32());
        if f.mx {
            return (e8m0_half(self.e[at]), m);
        }
        (f16::from_bits(self.d[at]).to_f32(), m)
    }

    /// The whole matrix as f32, row-major `rows * cols`.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (row, o) in out.chunks_exact_mut(self.cols).enumerate() {
            self.dequantize_into(row, o);
        }
        out
    }

    /// Writes row `row` as f32 into `out` (length `cols`), e.g. an embedding
    /// lookup: exactly GGML's `dequantize_row_*` of the stored blocks.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) -> Result<(), Error> {
        crate::check_row(row, self.rows, out.len(), self.cols)?;
        self.dequantize_into(row, out);
        Ok(())
    }

    fn dequantize_into(&self, row: usize, out: &mut [f32]) {
        for (b, o) in out.chunks_exact_mut(QK).enumerate() {
            let (d, m) = self.unit_scales(row, b);
            let q = self.block_quants(row, b);
            dequantize_block(self.ty, &q, self.block_sub(row, b), (d, m), o);
        }
    }
}

/// The first `len` elements of `s` (fewer if it is shorter), leaving the rest in `s`.
fn split_off<'a, T>(s: &mut &'a mut [T], len: usize) -> &'a mut [T] {
    let all = std::mem::take(s);
    let (head, tail) = all.split_at_mut(len.min(all.len()));
    *s = tail;
    head
}

/// Repacks the GGML blocks of panel `p`'s rows into its share of the arrays.
fn fill_panel(
    ty: QuantType,
    lay: Layout,
    (rows, cols): (usize, usize),
    data: &[u8],
    p: usize,
    out: PanelMut<'_>,
) {
    let f: Format = ty.format();
    let (nb, units, bb) = (cols / QK, cols / ty.block_len(), ty.block_bytes());
    let base = |units: usize, fields: usize| p * Layout::panel_len(units, fields);
    let (qs0, d0, sc0) = (4 * base(nb, f.regs()), base(units, 1), base(nb, 2));
    let mut dec = Decoded::default();
    let bits: [[(usize, u32); 2]; QK] = std::array::from_fn(|k| f.bits(k));
    for g in 2 * p..(2 * p + 2).min(lay.groups()) {
        for r in 0..GROUP {
            let row = g * GROUP + r;
            if row >= rows {
                break;
            }
            for unit in 0..units {
                let at = (row * units + unit) * bb;
                decode(ty, &data[at..at + bb], &mut dec);
                let ud = lay.index(g, unit, units, 0, 1) + r - d0;
                if f.mx {
                    out.e[ud] = dec.d as u8;
                } else {
                    out.d[ud] = dec.d;
                }
                if let Some(m) = out.m.get_mut(ud) {
                    *m = dec.m;
                }
                for (t, (q, sub)) in dec.q.iter().zip(&dec.sub).take(f.bpu).enumerate() {
                    let b = unit * f.bpu + t;
                    match f.sub {
                        Sub::None => {}
                        Sub::Per32 => {
                            out.sc[lay.index(g, b, nb, 0, 2) + r - sc0] = sub[0];
                            out.sc[lay.index(g, b, nb, 1, 2) + r - sc0] = sub[1];
                        }
                        Sub::Per16 | Sub::Per16Min => {
                            let at = 2 * (lay.index(g, b, nb, 0, 1) + r) - sc0;
                            out.sc[at..at + 2].copy_from_slice(sub);
                        }
                    }
                    // The row's 4 bytes of each plane register, then stored.
                    let mut words = [0u32; 8];
                    for (k, (&v, &[(lr, ls), (hr, hs)])) in q.iter().zip(&bits).enumerate() {
                        let (v, at) = (u32::from(v), 8 * (k % 4) as u32);
                        words[lr] |= (v & ((1 << f.lo) - 1)) << (at + ls);
                        if f.hi > 0 {
                            words[hr] |= ((v >> f.lo) & ((1 << f.hi) - 1)) << (at + hs);
                        }
                    }
                    for (k, word) in words.iter().enumerate().take(f.regs()) {
                        let at = 4 * (lay.index(g, b, nb, k, f.regs()) + r) - qs0;
                        out.qs[at..at + 4].copy_from_slice(&word.to_le_bytes());
                    }
                }
            }
        }
    }
}

/// One 32-block as f32, with GGML's `dequantize_row_*` float operations in
/// their order (so embedding rows match llama.cpp's bit for bit).
fn dequantize_block(
    ty: QuantType,
    q: &[u8; QK],
    sub: [u8; 2],
    (d, m): (f32, f32),
    out: &mut [f32],
) {
    for (k, (o, &u)) in out.iter_mut().zip(q).enumerate() {
        let (u, h) = (i32::from(u), sub[k / 16]);
        *o = match ty {
            QuantType::Q4_0 => (u - 8) as f32 * d,
            QuantType::Q5_0 => (u - 16) as f32 * d,
            QuantType::Q4_1 | QuantType::Q5_1 => u as f32 * d + m,
            QuantType::Q8_0 => f32::from(u as u8 as i8) * d,
            QuantType::Q2_K => d * f32::from(h & 0xF) * u as f32 - m * f32::from(h >> 4),
            QuantType::Q3_K => d * f32::from(h as i8) * (u - 4) as f32,
            QuantType::Q4_K | QuantType::Q5_K => {
                d * f32::from(sub[0]) * u as f32 - m * f32::from(sub[1])
            }
            QuantType::Q6_K => d * f32::from(h as i8) * (u - 32) as f32,
            QuantType::MXFP4 => f32::from(E2M1[u as usize]) * d,
        };
    }
}

#[cfg(test)]
#[path = "qmatrix_tests.rs"]
mod tests;
