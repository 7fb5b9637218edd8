//! A per-row limit on which tokens may come next (structured outputs): the
//! row masks its logits before sampling and advances the constraint with the
//! token it picked. The engine knows only this trait; the grammar engine that
//! implements it lives in its own crate.

/// What a row's grammar allows next. One value per choice: it holds that
/// choice's parse state.
pub trait TokenConstraint: Send {
    /// Sets to negative infinity the logits of every token not allowed next
    /// (ids past the grammar's vocabulary included). An error means no token
    /// can follow; the row then fails with the message.
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String>;
    /// Advances past `id`, the token just sampled from the masked logits.
    fn advance(&mut self, id: u32) -> Result<(), String>;
    /// How many of `tokens`, in order from here, the grammar allows (the
    /// longest allowed prefix), without advancing: speculative decoding
    /// verifies no draft token the grammar would refuse.
    fn allowed_prefix(&mut self, tokens: &[u32]) -> usize;
    /// True once the output is complete and nothing more may follow: the row
    /// ends with finish reason "stop".
    fn is_finished(&self) -> bool;
    /// An independent copy of this state, for another choice of the same
    /// request (`n > 1`).
    fn fork(&self) -> Box<dyn TokenConstraint>;
}
