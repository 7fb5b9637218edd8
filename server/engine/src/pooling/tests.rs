//! The pooling worker driven tick by tick over a model whose vector of a
//! sequence is `[length, sum of its tokens]`, so a batch's answers can be
//! checked against each input alone.

use std::sync::Arc;
use std::time::Instant;

use ferrox_core::PoolingModel;

use super::*;
use crate::{EngineConfig, EngineError, EngineHandle, Event, FinishReason, Metrics};

/// `[len, sum]` per sequence; records each batch's sizes; fails a batch
/// holding token 999.
#[derive(Default)]
struct Summing {
    batches: Batches,
}

impl PoolingModel for Summing {
    fn vocab_size(&self) -> usize {
        1000
    }

    fn max_len(&self) -> usize {
        64
    }

    fn embed(&mut self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>, ferrox_core::Error> {
        self.batches
            .lock()
            .unwrap()
            .push(seqs.iter().map(|s| s.len()).collect());
        if seqs.iter().any(|s| s.contains(&999)) {
            return Err(ferrox_core::Error::Forward(
                "token 999 breaks the model".into(),
            ));
        }
        Ok(seqs
            .iter()
            .map(|s| vec![s.len() as f32, s.iter().sum::<u32>() as f32])
            .collect())
    }

    /// `[len, sum, sum of the types]`, to see each input's types arrive.
    fn embed_typed(
        &mut self,
        seqs: &[&[u32]],
        types: Option<&[&[u32]]>,
    ) -> Result<Vec<Vec<f32>>, ferrox_core::Error> {
        let mut out = self.embed(seqs)?;
        if let Some(types) = types {
            assert_eq!(types.len(), seqs.len());
            for ((v, t), s) in out.iter_mut().zip(types).zip(seqs) {
                assert_eq!(t.len(), s.len());
                v.push(t.iter().sum::<u32>() as f32);
            }
        }
        Ok(out)
    }
}

fn config() -> EngineConfig {
    EngineConfig {
        pools: Vec::new(),
        max_batch_tokens: 10,
        max_seqs: 4,
        max_model_len: 8,
        max_queue: 3,
        ..EngineConfig::default()
    }
}

/// Each batch's input lengths, as the model saw them.
type Batches = Arc<std::sync::Mutex<Vec<Vec<usize>>>>;

fn engine(c: EngineConfig) -> (PoolingScheduler<Summing>, EngineHandle, Batches) {
    let model = Summing::default();
    let batches = Arc::clone(&model.batches);
    let metrics = Arc::new(Metrics::new().unwrap());
    let (s, h) = PoolingScheduler::new(model, c, metrics, Instant::now()).unwrap();
    (s, h, batches)
}

fn req(inputs: &[&[u32]]) -> PoolingRequest {
    PoolingRequest {
        inputs: inputs.iter().map(|i| i.to_vec()).collect(),
        token_types: Vec::new(),
        request_id: None,
    }
}

fn alone(input: &[u32]) -> Vec<f32> {
    vec![input.len() as f32, input.iter().sum::<u32>() as f32]
}

#[test]
fn a_batch_of_mixed_lengths_gives_each_input_its_own_vector() {
    let (mut s, h, batches) = engine(config());
    let inputs: [&[u32]; 3] = [&[1, 2, 3], &[4], &[5, 6, 7, 8, 9, 10]];
    let mut sub = h.submit_pooling(req(&inputs), Instant::now()).unwrap();
    let t = s.tick(Instant::now());
    assert_eq!(t.batch.len(), 3);
    assert_eq!(t.tokens, 10);
    let want: Vec<Vec<f32>> = inputs.iter().map(|i| alone(i)).collect();
    match sub.try_next() {
        Some(Event::Vectors { data, usage }) => {
            assert_eq!(data, want);
            assert_eq!(usage.prompt_tokens, 10);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(*batches.lock().unwrap(), vec![vec![3, 1, 6]]);
    assert!(s.is_idle());
    assert_eq!(h.in_flight(), 0);
}

#[test]
fn batches_are_fifo_by_input_under_the_token_budget() {
    let (mut s, h, batches) = engine(config());
    // 6 + 6 tokens: the second input waits for the next batch, and the
    // second request (which would fit) waits behind it.
    let mut a = h
        .submit_pooling(req(&[&[1; 6], &[2; 6]]), Instant::now())
        .unwrap();
    let mut b = h.submit_pooling(req(&[&[3; 2]]), Instant::now()).unwrap();
    assert_eq!(s.tick(Instant::now()).batch.len(), 1);
    assert!(a.try_next().is_none() && b.try_next().is_none());
    let t = s.tick(Instant::now());
    assert_eq!(t.batch.len(), 2);
    assert_eq!(t.finished.len(), 2);
    assert!(
        matches!(a.try_next(), Some(Event::Vectors { data, .. }) if data == vec![alone(&[1; 6]), alone(&[2; 6])])
    );
    assert!(
        matches!(b.try_next(), Some(Event::Vectors { data, .. }) if data == vec![alone(&[3; 2])])
    );
    assert_eq!(*batches.lock().unwrap(), vec![vec![6], vec![6, 2]]);
}

#[test]
fn cancelled_and_abandoned_requests_end_at_the_batch_boundary() {
    let (mut s, h, batches) = engine(config());
    let mut a = h.submit_pooling(req(&[&[1; 2]]), Instant::now()).unwrap();
    let b = h.submit_pooling(req(&[&[2; 2]]), Instant::now()).unwrap();
    let mut c = h.submit_pooling(req(&[&[3; 2]]), Instant::now()).unwrap();
    a.cancel();
    drop(b);
    let t = s.tick(Instant::now());
    assert!(matches!(
        a.try_next(),
        Some(Event::Done {
            reason: FinishReason::Cancelled,
            ..
        })
    ));
    assert_eq!(t.batch.len(), 1);
    assert!(matches!(c.try_next(), Some(Event::Vectors { .. })));
    assert_eq!(*batches.lock().unwrap(), vec![vec![2]]);
    assert_eq!(h.in_flight(), 0);
    assert!(s.is_idle());
}

#[test]
fn a_bad_input_fails_its_request_alone() {
    let (mut s, h, _) = engine(config());
    // Outside the vocabulary: refused by the model's check, before the batch.
    let mut bad = h
        .submit_pooling(req(&[&[1, 5000]]), Instant::now())
        .unwrap();
    // Breaks the forward: its batch fails (tried twice).
    let mut good = h.submit_pooling(req(&[&[1, 2]]), Instant::now()).unwrap();
    s.tick(Instant::now());
    match bad.try_next() {
        Some(Event::Error(EngineError::Invalid { message, .. })) => {
            assert!(message.contains("outside the vocabulary"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(good.try_next(), Some(Event::Vectors { .. })));
    let mut broken = h.submit_pooling(req(&[&[999]]), Instant::now()).unwrap();
    s.tick(Instant::now());
    assert!(matches!(
        broken.try_next(),
        Some(Event::Error(EngineError::Model(_)))
    ));
    let mut after = h.submit_pooling(req(&[&[7]]), Instant::now()).unwrap();
    s.tick(Instant::now());
    assert!(matches!(after.try_next(), Some(Event::Vectors { .. })));
    assert_eq!(h.in_flight(), 0);
}

#[test]
fn the_door_refuses_what_no_batch_can_hold_and_a_full_line() {
    let (_s, h, _) = engine(config());
    let cases: [(&[&[u32]], &str); 4] = [
        (&[], "the input is empty"),
        (&[&[1], &[]], "input 1 has no tokens"),
        (&[&[1; 9]], "more than the 8 the longest sequence served"),
        (&[&[1, 1], &[1, 1], &[1, 1], &[1, 1], &[1, 1], &[1, 1]], ""),
    ];
    for (inputs, want) in cases {
        match (h.submit_pooling(req(inputs), Instant::now()), want) {
            (Ok(_), "") => {}
            (Err(e), w) if !w.is_empty() => assert!(e.to_string().contains(w), "{e}"),
            (got, w) => panic!("{inputs:?}: {:?} vs {w}", got.map(|s| s.id())),
        }
    }
    let over_batch = EngineConfig {
        max_model_len: 64,
        ..config()
    };
    let (_s, h2, _) = engine(over_batch);
    let e = h2
        .submit_pooling(req(&[&[1; 11]]), Instant::now())
        .err()
        .unwrap();
    assert!(
        e.to_string()
            .contains("one batch holds (--max-batch-tokens)"),
        "{e}"
    );
    // The waiting line holds 3.
    let held: Vec<_> = (0..3)
        .map(|_| h2.submit_pooling(req(&[&[1]]), Instant::now()).unwrap())
        .collect();
    let full = h2
        .submit_pooling(req(&[&[1]]), Instant::now())
        .err()
        .unwrap();
    assert!(matches!(full, EngineError::QueueFull { max_queue: 3 }));
    drop(held);
}

#[test]
fn each_engine_refuses_the_other_kind_of_request() {
    let (_s, h, _) = engine(config());
    assert!(h.is_pooling());
    let e = h
        .submit(crate::fixtures::request(&[1, 2], 1), Instant::now())
        .err()
        .unwrap();
    assert!(e.to_string().contains("generates no text"), "{e}");
    let bad = PoolingScheduler::new(
        Summing::default(),
        EngineConfig::default(),
        Arc::new(Metrics::new().unwrap()),
        Instant::now(),
    );
    assert!(bad.is_err(), "a pooling engine with a KV pool");
}

#[test]
fn each_input_gets_its_own_token_types_and_bad_ones_are_refused() {
    let (mut s, h, _) = engine(config());
    let typed = PoolingRequest {
        token_types: vec![vec![0, 1, 1], vec![1]],
        ..req(&[&[1, 2, 3], &[4]])
    };
    let mut a = h.submit_pooling(typed, Instant::now()).unwrap();
    // Batched with an input of no types: its tokens are type 0.
    let mut b = h.submit_pooling(req(&[&[5, 6]]), Instant::now()).unwrap();
    assert_eq!(s.tick(Instant::now()).batch.len(), 3);
    assert!(matches!(a.try_next(), Some(Event::Vectors { data, .. })
        if data == vec![vec![3.0, 6.0, 2.0], vec![1.0, 4.0, 1.0]]));
    assert!(matches!(b.try_next(), Some(Event::Vectors { data, .. })
        if data == vec![vec![2.0, 11.0, 0.0]]));
    for token_types in [vec![vec![0, 1]], vec![vec![0, 0, 0], vec![]]] {
        let bad = PoolingRequest {
            token_types,
            ..req(&[&[1, 2, 3]])
        };
        let e = h.submit_pooling(bad, Instant::now()).err().unwrap();
        assert!(e.to_string().contains("token types"), "{e}");
    }
}
