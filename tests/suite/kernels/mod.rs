//! The kernels on both backends: naga's validation of every shader, GPU
//! against CPU, finite differences of every backward, and the small
//! compositions (REINFORCE's ops, an MLP under AdamW) built on them.

mod gpu_parity;
mod gradcheck;
mod mlp_train;
mod reinforce_ops;
mod shaders_validate;
