//! The projections an adapter may target, and their names in each format.

/// A projection of a decoder layer that an adapter may update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// Attention query.
    Q,
    /// Attention key.
    K,
    /// Attention value.
    V,
    /// Attention output.
    O,
    /// MLP gate.
    Gate,
    /// MLP up.
    Up,
    /// MLP down.
    Down,
}

/// `(target, PEFT module path within a layer, GGUF tensor stem)`.
const NAMES: [(Target, &str, &str); 7] = [
    (Target::Q, "self_attn.q_proj", "attn_q"),
    (Target::K, "self_attn.k_proj", "attn_k"),
    (Target::V, "self_attn.v_proj", "attn_v"),
    (Target::O, "self_attn.o_proj", "attn_output"),
    (Target::Gate, "mlp.gate_proj", "ffn_gate"),
    (Target::Up, "mlp.up_proj", "ffn_up"),
    (Target::Down, "mlp.down_proj", "ffn_down"),
];

/// PEFT modules whose one matrix holds several targets' rows (Phi-3's
/// checkpoints): their adapter's `B` rows split over the parts in order, as
/// the update of a block of rows is that block of `B` times `A`.
const FUSED: [(&str, &[Target]); 2] = [
    ("self_attn.qkv_proj", &[Target::Q, Target::K, Target::V]),
    ("mlp.gate_up_proj", &[Target::Gate, Target::Up]),
];

/// The targets a PEFT module (its path or short name) updates, in row
/// order: its own, or the parts of a fused module (`qkv_proj`).
pub fn module_parts(name: &str) -> Option<Vec<Target>> {
    if let Some(t) = Target::from_module(name) {
        return Some(vec![t]);
    }
    let short = |path: &str| path.rsplit_once('.').map_or(path, |(_, m)| m).to_string();
    FUSED
        .iter()
        .find(|(path, _)| *path == name || short(path) == name)
        .map(|(_, parts)| parts.to_vec())
}

impl Target {
    /// Every target, in the order [`Target::index`] numbers them.
    pub const ALL: [Target; 7] = [
        Target::Q,
        Target::K,
        Target::V,
        Target::O,
        Target::Gate,
        Target::Up,
        Target::Down,
    ];

    /// Position in [`Target::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The module path within a layer in Hugging Face / PEFT names
    /// (`self_attn.q_proj`).
    pub fn module_path(self) -> &'static str {
        NAMES[self.index()].1
    }

    /// The short module name PEFT's `target_modules` lists (`q_proj`).
    pub fn module(self) -> &'static str {
        let path = self.module_path();
        path.rsplit_once('.').map_or(path, |(_, m)| m)
    }

    /// The GGUF tensor stem (`attn_q`).
    pub fn gguf(self) -> &'static str {
        NAMES[self.index()].2
    }

    /// The target whose module path or short name is `name`.
    pub fn from_module(name: &str) -> Option<Target> {
        NAMES
            .iter()
            .map(|n| n.0)
            .find(|t| t.module_path() == name || t.module() == name)
    }

    /// The target whose GGUF stem is `stem`.
    pub fn from_gguf(stem: &str) -> Option<Target> {
        NAMES.iter().find(|n| n.2 == stem).map(|n| n.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in Target::ALL {
            assert_eq!(Target::ALL[t.index()], t);
            assert_eq!(Target::from_module(t.module()), Some(t));
            assert_eq!(Target::from_module(t.module_path()), Some(t));
            assert_eq!(Target::from_gguf(t.gguf()), Some(t));
        }
        assert_eq!(Target::Q.module(), "q_proj");
        assert_eq!(Target::Down.module_path(), "mlp.down_proj");
        assert_eq!(Target::from_module("lm_head"), None);
        assert_eq!(Target::from_gguf("token_embd"), None);
        assert_eq!(module_parts("v_proj"), Some(vec![Target::V]));
        let qkv = Some(vec![Target::Q, Target::K, Target::V]);
        assert_eq!(module_parts("qkv_proj"), qkv);
        assert_eq!(module_parts("self_attn.qkv_proj"), qkv);
        assert_eq!(
            module_parts("gate_up_proj"),
            Some(vec![Target::Gate, Target::Up])
        );
        assert_eq!(module_parts("lm_head"), None);
    }
}
