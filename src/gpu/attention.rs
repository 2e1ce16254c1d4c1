//! Attention on the GPU, self-attention's fused kernels and decoding's over
//! a KV cache: the twin of `shaders/attention.wgsl` and
//! `src/cpu/attention.rs`.

use super::{GpuBackend, GpuIds, GpuTensor, u};
use crate::backend::{AttentionShape, CachedAttention, Storage};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct AttentionParams {
    rows: u32,
    heads: u32,
    head_dim: u32,
    capacity: u32,
    position: u32,
    scale: f32,
    _pad: [u32; 2],
}

/// `Shape` in shaders/attention.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct SelfAttentionParams {
    batch: u32,
    seq: u32,
    heads: u32,
    head_dim: u32,
    causal: u32,
    use_mask: u32,
    scale: f32,
    _pad: u32,
}

impl SelfAttentionParams {
    fn new(l: &AttentionShape, use_mask: bool) -> Self {
        SelfAttentionParams {
            batch: u(l.batch),
            seq: u(l.seq),
            heads: u(l.heads),
            head_dim: u(l.head_dim),
            causal: l.causal as u32,
            use_mask: use_mask as u32,
            scale: l.scale(),
            _pad: 0,
        }
    }
}

/// Workgroups of the self-attention kernels: one per (item, head, tile
/// of 16 positions).
fn self_attention_groups(l: &AttentionShape) -> usize {
    l.batch * l.heads * l.seq.div_ceil(16)
}

pub(super) fn forward(
    gpu: &GpuBackend,
    qkv: &GpuTensor,
    key_mask: Option<&GpuIds>,
    out: &mut GpuTensor,
    lse: &mut GpuTensor,
    l: &AttentionShape,
) {
    l.check((qkv.len(), out.len(), lse.len()), key_mask.map(|m| m.len()));
    let params = SelfAttentionParams::new(l, key_mask.is_some());
    let mask = &key_mask.unwrap_or(&gpu.no_mask).0;
    gpu.dispatch(
        "attention",
        "attention_forward",
        &params,
        &[&qkv.0, mask, &out.0, &lse.0],
        gpu.grid(self_attention_groups(l)),
    );
}

#[allow(clippy::too_many_arguments)]
pub(super) fn backward(
    gpu: &GpuBackend,
    qkv: &GpuTensor,
    key_mask: Option<&GpuIds>,
    out: &GpuTensor,
    lse: &GpuTensor,
    d_out: &GpuTensor,
    dqkv: &mut GpuTensor,
    l: &AttentionShape,
) {
    let sizes = (qkv.len(), out.len(), lse.len(), d_out.len(), dqkv.len());
    l.check_backward(sizes, key_mask.map(|m| m.len()));
    let params = SelfAttentionParams::new(l, key_mask.is_some());
    let mask = &key_mask.unwrap_or(&gpu.no_mask).0;
    let buffers = [&qkv.0, mask, &out.0, &lse.0, &d_out.0, &dqkv.0];
    let groups = gpu.grid(self_attention_groups(l));
    // The query rows of dqkv, then its key and value rows.
    gpu.dispatch(
        "attention",
        "attention_backward_queries",
        &params,
        &buffers,
        groups,
    );
    gpu.dispatch(
        "attention",
        "attention_backward_keys",
        &params,
        &buffers,
        groups,
    );
}

pub(super) fn attend_cached(
    gpu: &GpuBackend,
    qkv: &GpuTensor,
    keys: &mut GpuTensor,
    values: &mut GpuTensor,
    out: &mut GpuTensor,
    l: &CachedAttention,
) {
    l.check((qkv.len(), keys.len(), values.len(), out.len()));
    let params = AttentionParams {
        rows: u(l.rows),
        heads: u(l.heads),
        head_dim: u(l.head_dim),
        capacity: u(l.capacity),
        position: u(l.position),
        scale: l.scale,
        _pad: [0; 2],
    };
    gpu.dispatch(
        "attention",
        "attend_cached",
        &params,
        &[&qkv.0, &keys.0, &values.0, &out.0],
        gpu.grid(l.rows * l.heads),
    );
}
