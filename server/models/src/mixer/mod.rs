//! The token-mixer kinds of a decoder layer, each owning its spec, its
//! weights, their loader, its forward and its state hooks; and what the
//! recurrent kinds share.

pub mod attention;
pub mod encoder;
pub mod gdn;
pub mod latent;
pub mod mamba2;
pub(crate) mod recurrent;
pub mod short_conv;
