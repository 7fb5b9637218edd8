//! Test-only: a minimal GGUF v2/v3 metadata reader (header and key/values;
//! it stops before the tensor infos), enough to get a model's vocabulary.

use std::collections::HashMap;
use std::io::{self, BufReader, Read};
use std::path::Path;

/// One metadata value.
#[derive(Debug, Clone)]
pub enum Meta {
    /// Any integer type, widened.
    Int(i64),
    /// f32 or f64.
    Float(f64),
    /// bool.
    Bool(bool),
    /// string.
    Str(String),
    /// array of any of the above.
    Array(Vec<Meta>),
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn read_n<const N: usize>(r: &mut impl Read) -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    r.read_exact(&mut b)?;
    Ok(b)
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    Ok(u32::from_le_bytes(read_n(r)?))
}

fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    Ok(u64::from_le_bytes(read_n(r)?))
}

fn read_string(r: &mut impl Read) -> io::Result<String> {
    let len = read_u64(r)?;
    if len > 1 << 30 {
        return Err(bad(format!("string of {len} bytes")));
    }
    let mut buf = vec![0u8; len as usize];
    r.read_exact(&mut buf)?;
    String::from_utf8(buf).map_err(|e| bad(e.to_string()))
}

fn read_value(r: &mut impl Read, ty: u32) -> io::Result<Meta> {
    Ok(match ty {
        0 => Meta::Int(u8::from_le_bytes(read_n(r)?).into()),
        1 => Meta::Int(i8::from_le_bytes(read_n(r)?).into()),
        2 => Meta::Int(u16::from_le_bytes(read_n(r)?).into()),
        3 => Meta::Int(i16::from_le_bytes(read_n(r)?).into()),
        4 => Meta::Int(read_u32(r)?.into()),
        5 => Meta::Int(i32::from_le_bytes(read_n(r)?).into()),
        6 => Meta::Float(f32::from_le_bytes(read_n(r)?).into()),
        7 => Meta::Bool(read_n::<1>(r)?[0] != 0),
        8 => Meta::Str(read_string(r)?),
        9 => {
            let item_ty = read_u32(r)?;
            let n = read_u64(r)?;
            let items = (0..n)
                .map(|_| read_value(r, item_ty))
                .collect::<io::Result<_>>()?;
            Meta::Array(items)
        }
        10 => Meta::Int(read_u64(r)? as i64),
        11 => Meta::Int(i64::from_le_bytes(read_n(r)?)),
        12 => Meta::Float(f64::from_le_bytes(read_n(r)?)),
        other => return Err(bad(format!("unknown GGUF value type {other}"))),
    })
}

/// Reads every metadata key/value of a GGUF file.
pub fn read_metadata(path: &Path) -> io::Result<HashMap<String, Meta>> {
    let mut r = BufReader::new(std::fs::File::open(path)?);
    if &read_n::<4>(&mut r)? != b"GGUF" {
        return Err(bad("not a GGUF file".into()));
    }
    let version = read_u32(&mut r)?;
    if !(2..=3).contains(&version) {
        return Err(bad(format!("GGUF version {version}")));
    }
    let _tensor_count = read_u64(&mut r)?;
    let kv_count = read_u64(&mut r)?;
    let mut out = HashMap::new();
    for _ in 0..kv_count {
        let key = read_string(&mut r)?;
        let ty = read_u32(&mut r)?;
        out.insert(key, read_value(&mut r, ty)?);
    }
    Ok(out)
}

impl Meta {
    /// The integer, if this is one.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Meta::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Meta::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The array's items, if this is one.
    pub fn as_array(&self) -> Option<&[Meta]> {
        match self {
            Meta::Array(a) => Some(a),
            _ => None,
        }
    }
}
