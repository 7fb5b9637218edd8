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
        shared_gated: false,
        gated: true,
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
        None,
        &mut out,
    );
    let got: Vec<u32> = out.iter().map(|c| c.0).collect();
    assert_eq!(got, [1, 3, 2]);
    assert!(out.iter().zip([1, 3, 2]).all(|(c, i)| close(c.1, p[i])));
    route(
        &spec(5, 3, Routing::SoftmaxTopK { normalize: true }),
        &logits,
        None,
        &mut out,
    );
    let kept = p[1] + p[3] + p[2];
    assert!(
        out.iter()
            .zip([1, 3, 2])
            .all(|(c, i)| close(c.1, p[i] / kept))
    );
    // gpt-oss: softmax over the kept logits alone, the same numbers.
    route(&spec(5, 3, Routing::TopKSoftmax), &logits, None, &mut out);
    assert!(
        out.iter()
            .zip([1, 3, 2])
            .all(|(c, i)| close(c.1, p[i] / kept))
    );
    let sum: f32 = out.iter().map(|c| c.1).sum();
    assert!(close(sum, 1.0));
    // Top-1 of a single expert.
    route(&spec(1, 1, Routing::TopKSoftmax), &[0.3], None, &mut out);
    assert_eq!(out, [(0, 1.0)]);
    // Llama 4: the largest logits, each its own sigmoid (no sum to one).
    let sigmoid = |x: f32| 1.0 / (1.0 + (-x).exp());
    route(&spec(5, 2, Routing::TopKSigmoid), &logits, None, &mut out);
    assert_eq!(out.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 3]);
    assert!(close(out[0].1, sigmoid(logits[1])) && close(out[1].1, sigmoid(logits[3])));
    assert!(spec(5, 2, Routing::TopKSigmoid).weights_input());
    assert!(!spec(5, 2, Routing::TopKSoftmax).weights_input());
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
    let d = Dispatch::new(&s, &logits, None);
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
    let alone = Dispatch::new(&s, &logits[4..8], None);
    assert_eq!(alone.weight(0), d.weight(2));
    assert_eq!(alone.weight(1), d.weight(3));
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// DeepSeek-V3's and GLM-4.5's router: the correction moves the choice,
/// not the weights; experts outside the best group are never chosen.
#[test]
fn sigmoid_routing_chooses_by_the_corrected_score_within_the_best_groups() {
    let groups = |groups, topk_groups, normalize, scale| Routing::SigmoidGroups {
        groups,
        topk_groups,
        normalize,
        scale,
    };
    let logits = [0.5f32, 2.0, -1.0, 1.0, 1.5, 0.0];
    let mut out = Vec::new();
    // (routing, correction, chosen experts in order)
    let cases: [(Routing, Option<[f32; 6]>, [u32; 2]); 4] = [
        (groups(1, 1, false, 1.0), None, [1, 4]),
        // The bias lifts expert 2 over 1 and 4 for the choice only.
        (
            groups(1, 1, false, 1.0),
            Some([0.0, 0.0, 0.9, 0.0, 0.0, 0.0]),
            [2, 1],
        ),
        // Groups {0,1,2} and {3,4,5}: their two best sum 2.5 and 2.5 by
        // logit but less by sigmoid for the first (0.88 + 0.62 < 0.73 + 0.82).
        (groups(2, 1, false, 1.0), None, [4, 3]),
        (groups(3, 2, true, 2.5), None, [1, 4]),
    ];
    for (routing, correction, want) in cases {
        route(
            &spec(6, 2, routing),
            &logits,
            correction.as_ref().map(|c| &c[..]),
            &mut out,
        );
        let got: Vec<u32> = out.iter().map(|c| c.0).collect();
        assert_eq!(got, want, "{routing:?}");
        let Routing::SigmoidGroups {
            normalize, scale, ..
        } = routing
        else {
            unreachable!()
        };
        let raw: Vec<f32> = want.iter().map(|&e| sigmoid(logits[e as usize])).collect();
        let sum: f32 = if normalize { raw.iter().sum() } else { 1.0 };
        for (c, r) in out.iter().zip(&raw) {
            assert!(close(c.1, r / sum * scale), "{routing:?}: {out:?}");
        }
    }
    let bad = spec(6, 4, groups(3, 1, true, 1.0));
    assert!(bad.validate().is_err(), "4 experts from one group of 2");
    assert!(spec(6, 2, groups(4, 1, true, 1.0)).validate().is_err());
}

#[test]
fn reads_count_per_expert() {
    let r = ExpertReads::new(3);
    r.record(1);
    r.record(1);
    r.record(7);
    assert_eq!(r.counts(), [0, 2, 0]);
}

#[test]
fn deepseek_v2_s_router_keeps_the_best_groups_and_scales_without_renormalising() {
    // Groups {0, 1} (best 0.6 logit 3) and {2, 3} (best logit 2.5).
    let logits = [3.0f32, 0.0, 2.5, 2.4];
    let e: Vec<f32> = logits.iter().map(|x| (x - 3.0f32).exp()).collect();
    let z: f32 = e.iter().sum();
    let p: Vec<f32> = e.iter().map(|v| v / z).collect();
    let mut out = Vec::new();
    let routing = |groups, topk_groups| Routing::SoftmaxGroups {
        groups,
        topk_groups,
        scale: 1.5,
    };
    // Greedy (one group): the two largest probabilities, times 1.5.
    route(&spec(4, 2, routing(1, 1)), &logits, None, &mut out);
    assert_eq!(out.iter().map(|c| c.0).collect::<Vec<_>>(), [0, 2]);
    assert!(close(out[0].1, 1.5 * p[0]) && close(out[1].1, 1.5 * p[2]));
    // Group-limited to the best group: expert 1 (logit 0) over 2 and 3.
    route(&spec(4, 2, routing(2, 1)), &logits, None, &mut out);
    assert_eq!(out.iter().map(|c| c.0).collect::<Vec<_>>(), [0, 1]);
    assert!(close(out[1].1, 1.5 * p[1]));
    // Uneven groups are refused.
    assert!(spec(4, 2, routing(3, 1)).validate().is_err());
}
