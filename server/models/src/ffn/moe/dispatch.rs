//! One step's dispatch: every token's chosen experts, grouped by expert.

use super::route::route;
use super::spec::MoeSpec;

/// The tokens of a step grouped by the experts they chose: each active
/// expert with its cells (`token * top_k + slot`, in token order), and each
/// cell's weight. Experts no token chose have no cells.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatch {
    top_k: usize,
    /// Per cell: its weight.
    weights: Vec<f32>,
    /// Per expert: where its cells start in `cells` (`experts + 1` entries).
    starts: Vec<usize>,
    /// Cells, expert after expert.
    cells: Vec<u32>,
}

impl Dispatch {
    /// Routes every token of `logits` (`tokens * experts`, row-major),
    /// with the layer's correction bias where its routing has one.
    pub fn new(spec: &MoeSpec, logits: &[f32], correction: Option<&[f32]>) -> Self {
        let (experts, k) = (spec.experts, spec.top_k);
        let tokens = logits.len() / experts.max(1);
        let mut weights = vec![0f32; tokens * k];
        let mut expert_of = vec![0u32; tokens * k];
        let mut chosen = Vec::with_capacity(k + 1);
        for (t, row) in logits.chunks_exact(experts).enumerate() {
            route(spec, row, correction, &mut chosen);
            for (slot, &(e, w)) in chosen.iter().enumerate() {
                weights[t * k + slot] = w;
                expert_of[t * k + slot] = e;
            }
        }
        // A counting sort by expert keeps each expert's cells in token order.
        let mut starts = vec![0usize; experts + 1];
        for &e in &expert_of {
            starts[e as usize + 1] += 1;
        }
        for e in 0..experts {
            starts[e + 1] += starts[e];
        }
        let mut next = starts.clone();
        let mut cells = vec![0u32; expert_of.len()];
        for (cell, &e) in expert_of.iter().enumerate() {
            cells[next[e as usize]] = cell as u32;
            next[e as usize] += 1;
        }
        Dispatch {
            top_k: k,
            weights,
            starts,
            cells,
        }
    }

    /// Experts each token runs through.
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// Tokens routed.
    pub fn tokens(&self) -> usize {
        self.weights.len() / self.top_k.max(1)
    }

    /// Each expert some token chose, with its cells.
    pub fn active(&self) -> impl Iterator<Item = (usize, &[u32])> + '_ {
        self.starts
            .windows(2)
            .enumerate()
            .filter(|(_, w)| w[1] > w[0])
            .map(|(e, w)| (e, &self.cells[w[0]..w[1]]))
    }

    /// The weight of cell `cell`.
    pub fn weight(&self, cell: u32) -> f32 {
        self.weights[cell as usize]
    }

    /// The token of cell `cell`.
    pub fn token(&self, cell: u32) -> usize {
        cell as usize / self.top_k
    }
}
