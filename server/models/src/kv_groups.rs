//! The model's KV groups: its layers by attention kind (full attention, each
//! sliding window), each group with its own pool of blocks.
//!
//! Provisional: [`KvGroup`] and [`kv_groups`] stand for the families' layer
//! description, which lists its groups the same way; [`canonical`] is what
//! the server does with any such list.

use crate::config::ModelConfig;

/// One KV group: layers of one attention kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvGroup {
    /// The window in tokens (a layer attends to its last `window` positions,
    /// its own included); `None` for full attention.
    pub window: Option<usize>,
    /// The layers in it, by index.
    pub layers: Vec<usize>,
}

/// The groups of `config`: every layer in one group, windowed by Mistral's
/// `sliding_window` when it has one.
pub fn kv_groups(config: &ModelConfig) -> Vec<KvGroup> {
    vec![KvGroup {
        window: config.sliding_window,
        layers: (0..config.layers).collect(),
    }]
}

/// `groups` in the order every part of the server lists pools: full
/// attention first, then each window, smallest first; groups of one window
/// merged, and a window that never slides in `context` tokens counted as full
/// attention (ferrox-plan's rule, so the plan's pools are these).
pub fn canonical(groups: Vec<KvGroup>, context: usize) -> Vec<KvGroup> {
    let mut out: Vec<KvGroup> = Vec::new();
    for g in groups {
        let window = g
            .window
            .filter(|&w| ferrox_plan::slides(w as u64, context as u64));
        match out.iter_mut().find(|o| o.window == window) {
            Some(o) => o.layers.extend(g.layers),
            None if !g.layers.is_empty() => out.push(KvGroup {
                window,
                layers: g.layers,
            }),
            None => {}
        }
    }
    for g in &mut out {
        g.layers.sort_unstable();
    }
    out.sort_by_key(|g| g.window.map_or((0, 0), |w| (1, w)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_come_full_first_then_windows_smallest_first() {
        let g = |window, layers: &[usize]| KvGroup {
            window,
            layers: layers.to_vec(),
        };
        let gemma = vec![
            g(Some(1024), &[0, 1, 2, 3, 4]),
            g(None, &[5]),
            g(Some(1024), &[6, 7]),
        ];
        assert_eq!(
            canonical(gemma, 131_072),
            [g(None, &[5]), g(Some(1024), &[0, 1, 2, 3, 4, 6, 7])]
        );
        let two = vec![g(Some(512), &[0]), g(Some(128), &[1]), g(None, &[2])];
        assert_eq!(
            canonical(two, 4096),
            [g(None, &[2]), g(Some(128), &[1]), g(Some(512), &[0])]
        );
        // A window no shorter than the context is full attention.
        let phi = vec![g(Some(262_144), &[0, 1])];
        assert_eq!(canonical(phi, 131_072), [g(None, &[0, 1])]);
        assert_eq!(canonical(vec![g(None, &[])], 8), []);
    }
}
