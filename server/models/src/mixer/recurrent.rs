//! What the recurrent mixers (Mamba-2, Gated DeltaNet) share.

pub(crate) mod conv;
