//! Composite ops written once against [`Backend`](crate::backend::Backend):
//! each is a readable sequence of kernel calls, forward then backward.

pub mod additive_attention;
pub mod attention;
pub mod contrastive;
pub mod cross_attention;
pub mod cross_entropy;
pub mod linear;
pub mod sequence_likelihood;
