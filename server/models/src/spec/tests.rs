//! The spec's groups and its refusals of unusable numbers.

use super::*;

fn layer(window: Option<usize>) -> LayerSpec {
    LayerSpec {
        mixer: Mixer::Attention(AttentionSpec {
            window,
            chunk: None,
            rope: 0,
            scale: 0.25,
            softcap: None,
            qk_norm: false,
            qk_norm_whole: false,
            qk_norm_weightless: false,
            sinks: false,
            nope: false,
            gated: false,
            temperature: None,
            kv: crate::spec::KvLayout::default(),
        }),
        ffn: FeedForward::Gated(Activation::Silu),
    }
}

pub(crate) fn spec(windows: &[Option<usize>]) -> ModelSpec {
    ModelSpec {
        family: "llama",
        hidden: 64,
        intermediate: 128,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        vocab: 100,
        context: 256,
        layers: windows.iter().map(|&w| layer(w)).collect(),
        norms: Norms {
            eps: 1e-5,
            layer_norm: false,
            after_residual: false,
            offset: 0.0,
            pre: true,
            post_attention: false,
            post_ffn: false,
        },
        ropes: vec![RopeSpec {
            theta: 1e4,
            rotary_dim: 16,
            scaling: RopeScaling::None,
        }],
        embed_scale: None,
        final_softcap: None,
        qkv_bias: false,
        residual_scale: None,
        logit_scale: None,
        input: InputSpec::default(),
        final_norm: true,
        ffn_widths: Vec::new(),
        per_layer_input: None,
        layer_out_scale: false,
    }
}

#[test]
fn groups_put_full_layers_first_and_each_window_apart() {
    let s = spec(&[Some(8), Some(8), None, Some(16), Some(8), None, Some(512)])
        .finish()
        .unwrap();
    let g = s.kv_groups();
    let want = [
        (None, vec![2, 5, 6]),
        (Some(8), vec![0, 1, 4]),
        (Some(16), vec![3]),
    ];
    let got: Vec<_> = g.iter().map(|g| (g.window, g.layers.clone())).collect();
    assert_eq!(got, want, "a window past the context is full attention");
    assert_eq!(s.layer_groups(), [1, 1, 0, 2, 1, 0, 0]);
    let only_windowed = spec(&[Some(4), Some(4)]).finish().unwrap();
    assert_eq!(only_windowed.kv_groups().len(), 1);
    assert_eq!(only_windowed.layer_groups(), [0, 0]);
    let at_context = spec(&[Some(256), Some(255)]).finish().unwrap();
    let got: Vec<_> = at_context.kv_groups().iter().map(|g| g.window).collect();
    assert_eq!(
        got,
        [None, Some(255)],
        "a window of the context never slides"
    );
}

/// The plan's pools are the decoder's groups: the same windows, layer
/// counts and order from the geometry `inspect` reports.
#[test]
fn the_plan_s_groups_are_the_spec_s() {
    for windows in [
        vec![Some(8), Some(8), None, Some(16), Some(8), None, Some(512)],
        vec![Some(4), Some(4)],
        vec![None, None],
        vec![Some(255), Some(256), Some(1000)],
    ] {
        let s = spec(&windows).finish().unwrap();
        let geometry = ferrox_plan::ModelGeometry {
            layers: s.layers.len() as u64,
            context_length: s.context as u64,
            sliding_windows: s.sliding_windows(),
            ..Default::default()
        };
        let plan: Vec<_> = geometry
            .cache_groups()
            .iter()
            .map(|g| (g.kind().window().map(|w| w as usize), g.layers as usize))
            .collect();
        let ours: Vec<_> = s
            .kv_groups()
            .iter()
            .map(|g| (g.window, g.layers.len()))
            .collect();
        assert_eq!(plan, ours, "{windows:?}");
    }
}

#[test]
fn unusable_numbers_are_refused() {
    type Break = fn(&mut ModelSpec);
    let cases: [(&str, Break); 7] = [
        ("zero dimension", |s| s.hidden = 0),
        ("not a multiple", |s| s.kv_heads = 3),
        ("rotary dim", |s| s.ropes[0].rotary_dim = 15),
        ("layer 0", |s| {
            if let Mixer::Attention(a) = &mut s.layers[0].mixer {
                a.window = Some(0);
            }
        }),
        ("soft-cap", |s| {
            if let Mixer::Attention(a) = &mut s.layers[0].mixer {
                a.softcap = Some(-1.0);
            }
        }),
        ("final soft-cap", |s| s.final_softcap = Some(f32::NAN)),
        ("neither a mixer nor a feed-forward", |s| {
            s.layers[0] = LayerSpec {
                mixer: Mixer::None,
                ffn: FeedForward::None,
            };
        }),
    ];
    for (want, break_it) in cases {
        let mut s = spec(&[None]);
        break_it(&mut s);
        let err = s.finish().unwrap_err().to_string();
        assert!(err.contains(want), "{want}: {err}");
    }
}

#[test]
fn a_gated_delta_net_keeps_a_state_and_its_unusable_numbers_are_refused() {
    let gdn = GdnSpec {
        key_heads: 2,
        value_heads: 4,
        key_dim: 16,
        value_dim: 16,
        conv_kernel: 4,
        chunk: 64,
        tiled: false,
    };
    let with = |g: GdnSpec| {
        let mut s = spec(&[None, None]);
        s.layers[0].mixer = Mixer::GatedDeltaNet(g);
        s.finish()
    };
    let s = with(gdn).unwrap();
    assert_eq!(s.recurrent_layers(), [0]);
    assert_eq!(
        s.kv_groups()[0].layers,
        [1],
        "KV for the attention layer only"
    );
    // conv 3 * (2 * 32 + 64) values, state 4 * 16 * 16, in f32.
    assert_eq!(s.state_bytes(), 4 * (3 * 128 + 4 * 16 * 16));
    assert_eq!(s.layers[0].scan_chunk(), Some(64));
    for (want, g) in [
        (
            "3 linear-attention value heads not a multiple of 2 key heads",
            GdnSpec {
                value_heads: 3,
                ..gdn
            },
        ),
        (
            "unusable dimensions",
            GdnSpec {
                conv_kernel: 1,
                ..gdn
            },
        ),
        ("unusable dimensions", GdnSpec { key_dim: 0, ..gdn }),
    ] {
        let err = with(g).unwrap_err().to_string();
        assert!(err.contains(want) && err.contains("layer 0"), "{err}");
    }
}
