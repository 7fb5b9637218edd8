//! The header of a GGUF file (metadata and tensor directory), read by us:
//! candle's reader refuses a whole file at the first tensor type it does not
//! know, and llama.cpp's gpt-oss files hold their experts as MXFP4 (GGML
//! type 39). Such tensors are listed as the Q5_0 they become where candle
//! reads them ([`crate::mxfp4`]) and marked, so everything past the header
//! sees types candle knows (our CPU kernels run them as stored).
//!
//! Every count and length is untrusted: each is checked against the bytes
//! left in the file before anything is allocated for it.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Seek, SeekFrom};

use candle_core::quantized::GgmlDType;
use candle_core::quantized::gguf_file::{Content, TensorInfo, Value, VersionedMagic};

/// GGML's type id of MXFP4.
pub const MXFP4: u32 = 39;
/// GGML's most dimensions a tensor has.
const MAX_DIMS: u32 = 4;
/// Arrays inside arrays deeper than this are refused.
const MAX_NESTING: usize = 4;

/// A GGUF file's header.
pub struct Header {
    /// Metadata and tensors as candle's types (MXFP4 tensors as Q5_0).
    pub content: Content,
    /// Tensors stored as MXFP4.
    pub mxfp4: HashSet<String>,
}

/// Reads the header of the GGUF file `r` (from its start); an error says
/// what is wrong with the file.
pub fn read<R: Read + Seek>(r: &mut R) -> Result<Header, String> {
    let size = r.seek(SeekFrom::End(0)).map_err(io)?;
    r.seek(SeekFrom::Start(0)).map_err(io)?;
    let mut c = Cursor { r, left: size };
    if c.u32()? != u32::from_le_bytes(*b"GGUF") {
        return Err("no GGUF magic".into());
    }
    let magic = match c.u32()? {
        2 => VersionedMagic::GgufV2,
        3 => VersionedMagic::GgufV3,
        v => return Err(format!("GGUF version {v} is not read (2 and 3 are)")),
    };
    let (tensors, kvs) = (c.u64()?, c.u64()?);
    let mut metadata = HashMap::new();
    for _ in 0..c.count(kvs, 13)? {
        let key = c.string()?;
        let ty = c.u32()?;
        metadata.insert(key, c.value(ty, 0)?);
    }
    let mut tensor_infos = HashMap::new();
    let mut mxfp4 = HashSet::new();
    for _ in 0..c.count(tensors, 24)? {
        let name = c.string()?;
        let rank = c.u32()?;
        if rank > MAX_DIMS {
            return Err(format!("tensor {name} has {rank} dimensions"));
        }
        let mut dims = (0..rank)
            .map(|_| c.u64().map(|d| d as usize))
            .collect::<Result<Vec<_>, _>>()?;
        // GGUF lists the fastest-moving dimension first.
        dims.reverse();
        let ty = c.u32()?;
        let ggml_dtype = match (dtype(ty), ty) {
            (Some(d), _) => d,
            (None, MXFP4) => {
                mxfp4.insert(name.clone());
                GgmlDType::Q5_0
            }
            (None, _) => return Err(format!("tensor {name} has GGML type {ty}, not read here")),
        };
        let offset = c.u64()?;
        let shape = candle_core::Shape::from(dims);
        tensor_infos.insert(
            name,
            TensorInfo {
                ggml_dtype,
                shape,
                offset,
            },
        );
    }
    let align = match metadata.get("general.alignment") {
        Some(Value::U32(a)) if *a > 0 => u64::from(*a),
        None => 32,
        Some(other) => return Err(format!("general.alignment is {other:?}")),
    };
    let at = size - c.left;
    let tensor_data_offset = at.div_ceil(align).saturating_mul(align);
    Ok(Header {
        content: Content {
            magic,
            metadata,
            tensor_infos,
            tensor_data_offset,
        },
        mxfp4,
    })
}

fn io(e: std::io::Error) -> String {
    e.to_string()
}

/// GGML type ids candle reads, by id.
fn dtype(id: u32) -> Option<GgmlDType> {
    use GgmlDType::*;
    Some(match id {
        0 => F32,
        1 => F16,
        2 => Q4_0,
        3 => Q4_1,
        6 => Q5_0,
        7 => Q5_1,
        8 => Q8_0,
        9 => Q8_1,
        10 => Q2K,
        11 => Q3K,
        12 => Q4K,
        13 => Q5K,
        14 => Q6K,
        15 => Q8K,
        30 => BF16,
        _ => return None,
    })
}

/// A reader that knows how many bytes the file has left.
struct Cursor<'a, R> {
    r: &'a mut R,
    left: u64,
}

impl<R: Read> Cursor<'_, R> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], String> {
        self.take(N as u64)?;
        let mut b = [0u8; N];
        self.r.read_exact(&mut b).map_err(io)?;
        Ok(b)
    }

    fn take(&mut self, n: u64) -> Result<(), String> {
        self.left = self
            .left
            .checked_sub(n)
            .ok_or_else(|| format!("header runs past the end of the file ({n} bytes wanted)"))?;
        Ok(())
    }

    fn u32(&mut self) -> Result<u32, String> {
        self.bytes().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, String> {
        self.bytes().map(u64::from_le_bytes)
    }

    /// `n` entries of at least `min` bytes each, if the file has room.
    fn count(&self, n: u64, min: u64) -> Result<u64, String> {
        match n.checked_mul(min) {
            Some(need) if need <= self.left => Ok(n),
            _ => Err(format!(
                "header declares {n} entries, more than its {} bytes left hold",
                self.left
            )),
        }
    }

    fn string(&mut self) -> Result<String, String> {
        let n = self.u64()?;
        self.take(n)?;
        let mut b = vec![0u8; n as usize];
        self.r.read_exact(&mut b).map_err(io)?;
        String::from_utf8(b).map_err(|_| "a string is not UTF-8".into())
    }

    /// A value of GGUF type `ty`.
    fn value(&mut self, ty: u32, depth: usize) -> Result<Value, String> {
        Ok(match ty {
            0 => Value::U8(u8::from_le_bytes(self.bytes()?)),
            1 => Value::I8(i8::from_le_bytes(self.bytes()?)),
            2 => Value::U16(u16::from_le_bytes(self.bytes()?)),
            3 => Value::I16(i16::from_le_bytes(self.bytes()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.bytes()?)),
            6 => Value::F32(f32::from_le_bytes(self.bytes()?)),
            7 => Value::Bool(self.bytes::<1>()?[0] != 0),
            8 => Value::String(self.string()?),
            9 if depth < MAX_NESTING => {
                let ty = self.u32()?;
                let n = self.u64()?;
                let n = self.count(n, 1)?;
                let mut items = Vec::with_capacity(n.min(1 << 20) as usize);
                for _ in 0..n {
                    items.push(self.value(ty, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.bytes()?)),
            12 => Value::F64(f64::from_le_bytes(self.bytes()?)),
            9 => return Err("arrays nested too deep".into()),
            _ => return Err(format!("metadata value of unknown type {ty}")),
        })
    }
}

#[cfg(test)]
mod tests;
