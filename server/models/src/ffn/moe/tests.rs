use super::*;
use crate::spec::Activation;

fn spec(experts: usize, top_k: usize, routing: Routing) -> MoeSpec {
    MoeSpec {
        experts,
        top_k,
        intermediate: 32,
        activation: Activation::Silu,
        routing,
        biases: false,
        shared: None,
    }
}

fn close(a: f32, b: f32) -> bool {
    (a - b).abs() < 1e-6
}

#[test]
fn each_routing_weighs_the_chosen_experts_as_transformers_does() {
    let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
    // softmax: the probabilities over all five.
    let e: Vec<f32> = logits.iter().map(|x| (x - 3.0f32).exp()).collect();
    let z: f32 = e.iter().sum();
    let p: Vec<f32> = e.iter().map(|v| v / z).collect();
    let mut out = Vec::new();
    // Ties go to the lower expert: 1 before 3.
    route(
        &spec(5, 3, Routing::SoftmaxTopK { normalize: false }),
        &logits,
        &mut out,
    );
    let got: Vec<u32> = out.iter().map(|c| c.0).collect();
    assert_eq!(got, [1, 3, 2]);
    assert!(out.iter().zip([1, 3, 2]).all(|(c, i)| close(c.1, p[i])));
    route(
        &spec(5, 3, Routing::SoftmaxTopK { normalize: true }),
        &logits,
        &mut out,
    );
    let kept = p[1] + p[3] + p[2];
    assert!(
        out.iter()
            .zip([1, 3, 2])
            .all(|(c, i)| close(c.1, p[i] / kept))
    );
    // gpt-oss: softmax over the kept logits alone, the same numbers.
    route(&spec(5, 3, Routing::TopKSoftmax), &logits, &mut out);
    assert!(
        out.iter()
            .zip([1, 3, 2])
            .all(|(c, i)| close(c.1, p[i] / kept))
    );
    let sum: f32 = out.iter().map(|c| c.1).sum();
    assert!(close(sum, 1.0));
    // Top-1 of a single expert.
    route(&spec(1, 1, Routing::TopKSoftmax), &[0.3], &mut out);
    assert_eq!(out, [(0, 1.0)]);
}

#[test]
fn a_dispatch_groups_cells_by_expert_in_token_order_and_skips_the_unchosen() {
    let s = spec(4, 2, Routing::SoftmaxTopK { normalize: true });
    // Token 0 picks 2, 0; token 1 picks 2, 1; token 2 picks 0, 2.
    let logits = [
        2.0, 0.0, 3.0, -1.0, //
        0.0, 2.0, 3.0, -1.0, //
        3.0, 0.0, 2.0, -1.0,
    ];
    let d = Dispatch::new(&s, &logits);
    assert_eq!((d.tokens(), d.top_k()), (3, 2));
    let active: Vec<(usize, Vec<u32>)> = d.active().map(|(e, c)| (e, c.to_vec())).collect();
    // Cells are token * 2 + slot.
    assert_eq!(
        active,
        [(0, vec![1, 4]), (1, vec![3]), (2, vec![0, 2, 5])],
        "expert 3 was chosen by no token"
    );
    assert_eq!(d.token(5), 2);
    for t in 0..3 {
        let sum = d.weight(2 * t as u32) + d.weight(2 * t as u32 + 1);
        assert!(close(sum, 1.0), "token {t}: {sum}");
    }
    // A token's choice is its own: routed alone it is the same.
    let alone = Dispatch::new(&s, &logits[4..8]);
    assert_eq!(alone.weight(0), d.weight(2));
    assert_eq!(alone.weight(1), d.weight(3));
}

#[test]
fn reads_count_per_expert() {
    let r = ExpertReads::new(3);
    r.record(1);
    r.record(1);
    r.record(7);
    assert_eq!(r.counts(), [0, 2, 0]);
}
