//! The interface the pooling worker drives a model through: a batch of
//! whole sequences in, one vector each out, nothing kept between calls (no
//! pool, no block table: an embedder's forward holds no cache).

use crate::Error;

/// A model that turns whole sequences into vectors, one forward a batch.
pub trait PoolingModel: Send {
    /// Token ids below this are in the vocabulary.
    fn vocab_size(&self) -> usize;

    /// The most tokens one sequence may have (positions served).
    fn max_len(&self) -> usize;

    /// Checks one sequence before a batch: some tokens, each inside the
    /// vocabulary, no more than [`PoolingModel::max_len`]. The worker
    /// leaves a sequence that fails out of the batch and ends its request
    /// alone.
    fn check_input(&self, tokens: &[u32]) -> Result<(), Error> {
        if tokens.is_empty() {
            return Err(Error::Forward("a sequence with no tokens".into()));
        }
        if tokens.len() > self.max_len() {
            return Err(Error::Forward(format!(
                "{} tokens are more than the model's {} positions",
                tokens.len(),
                self.max_len()
            )));
        }
        match tokens.iter().find(|&&t| t as usize >= self.vocab_size()) {
            Some(bad) => Err(Error::Forward(format!(
                "token {bad} is outside the vocabulary of {}",
                self.vocab_size()
            ))),
            None => Ok(()),
        }
    }

    /// One vector per sequence, in order, as the model pools it (not
    /// normalized, not truncated: the caller does what its request asks).
    /// A batch gives each sequence the vector it gets alone.
    fn embed(&mut self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>, Error>;

    /// [`PoolingModel::embed`] with each token's type (`types[i][j]` of
    /// sequence `i`'s token `j`: a cross-encoder's document is type 1);
    /// `None` is type 0 everywhere. A model without token types refuses
    /// them.
    fn embed_typed(
        &mut self,
        seqs: &[&[u32]],
        types: Option<&[&[u32]]>,
    ) -> Result<Vec<Vec<f32>>, Error> {
        match types {
            None => self.embed(seqs),
            Some(_) => Err(Error::Forward("the model takes no token types".into())),
        }
    }
}
