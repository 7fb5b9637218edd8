use std::io::Cursor as Io;

use candle_core::quantized::gguf_file::{self, Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::*;

/// A GGUF file written by candle's writer: every metadata type, a nested
/// array, and tensors of three types.
fn written() -> Vec<u8> {
    let md = [
        ("a.u8", Value::U8(7)),
        ("a.i8", Value::I8(-7)),
        ("a.u16", Value::U16(700)),
        ("a.i16", Value::I16(-700)),
        ("a.u32", Value::U32(70_000)),
        ("a.i32", Value::I32(-70_000)),
        ("a.u64", Value::U64(1 << 40)),
        ("a.i64", Value::I64(-(1 << 40))),
        ("a.f32", Value::F32(0.5)),
        ("a.f64", Value::F64(-0.25)),
        ("a.bool", Value::Bool(true)),
        ("a.str", Value::String("héllo".into())),
        (
            "a.arr",
            Value::Array(vec![
                Value::Array(vec![Value::String("x".into())]),
                Value::Array(vec![Value::String("yz".into())]),
            ]),
        ),
    ];
    let w = Tensor::arange(0f32, 64.0, &Device::Cpu).unwrap();
    let ts = [
        ("v", QTensor::quantize(&w, GgmlDType::F32).unwrap()),
        (
            "m",
            QTensor::quantize(&w.reshape((2, 32)).unwrap(), GgmlDType::Q8_0).unwrap(),
        ),
        ("h", QTensor::quantize(&w, GgmlDType::F16).unwrap()),
    ];
    let mut out = Io::new(Vec::new());
    let md: Vec<_> = md.iter().map(|(k, v)| (*k, v)).collect();
    let ts: Vec<_> = ts.iter().map(|(k, v)| (*k, v)).collect();
    gguf_file::write(&mut out, &md, &ts).unwrap();
    out.into_inner()
}

#[test]
fn reads_what_candle_writes_as_candle_does() {
    let bytes = written();
    let ours = read(&mut Io::new(&bytes)).unwrap();
    let theirs = Content::read(&mut Io::new(&bytes)).unwrap();
    assert!(ours.mxfp4.is_empty());
    let (a, b) = (&ours.content, &theirs);
    assert_eq!(a.tensor_data_offset, b.tensor_data_offset);
    assert_eq!(a.metadata.len(), b.metadata.len());
    for (k, v) in &b.metadata {
        assert_eq!(format!("{:?}", a.metadata[k]), format!("{v:?}"), "{k}");
    }
    assert_eq!(a.tensor_infos.len(), 3);
    for (k, t) in &b.tensor_infos {
        let o = &a.tensor_infos[k];
        assert_eq!(
            (o.ggml_dtype, o.shape.dims(), o.offset),
            (t.ggml_dtype, t.shape.dims(), t.offset),
            "{k}"
        );
    }
}

#[test]
fn every_truncation_is_an_error_never_a_panic() {
    let bytes = written();
    let end = read(&mut Io::new(&bytes))
        .unwrap()
        .content
        .tensor_data_offset as usize;
    // Cut anywhere in the header (the data's padding may be cut too).
    for n in 0..end - 31 {
        let err = read(&mut Io::new(&bytes[..n])).err();
        assert!(err.is_some(), "a header cut at {n} bytes was read");
    }
}

/// The bytes of a v3 header with `kvs` metadata entries declared (none
/// present) and one tensor `[32]` of GGML type `ty`.
fn one_tensor(ty: u32, kvs: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(1u64.to_le_bytes());
    b.extend(kvs.to_le_bytes());
    let name = b"blk.0.ffn_down_exps.weight";
    b.extend((name.len() as u64).to_le_bytes());
    b.extend(name);
    b.extend(1u32.to_le_bytes());
    b.extend(32u64.to_le_bytes());
    b.extend(ty.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.resize(b.len().next_multiple_of(32) + 17, 0);
    b
}

#[test]
fn an_mxfp4_tensor_is_listed_as_q5_0_and_marked() {
    let h = read(&mut Io::new(one_tensor(MXFP4, 0))).unwrap();
    let name = "blk.0.ffn_down_exps.weight";
    assert!(h.mxfp4.contains(name));
    let t = &h.content.tensor_infos[name];
    assert_eq!((t.ggml_dtype, t.shape.dims()), (GgmlDType::Q5_0, &[32][..]));
}

#[test]
fn bad_headers_are_refused_with_the_reason() {
    let cases = [
        (one_tensor(99, 0), "GGML type 99"),
        (one_tensor(MXFP4, u64::MAX / 2), "entries"),
        (b"GGML\x03\0\0\0".to_vec(), "magic"),
        (b"GGUF\x01\0\0\0".to_vec(), "version 1"),
    ];
    for (bytes, want) in cases {
        let err = read(&mut Io::new(bytes)).err().expect("refused");
        assert!(err.contains(want), "{err} lacks {want}");
    }
}
