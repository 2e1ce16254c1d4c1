//! Matrix products on the GPU, with their epilogues and split-K: the twin
//! of `shaders/matmul.wgsl` and `src/cpu/matmul.rs`; `matmul_plan` chooses
//! each product's kernel and split.

use super::matmul_plan::{self, MatmulPlan};
use super::{GpuBackend, GpuTensor, reduce, u};
use crate::backend::{Matmul, Storage};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct MatmulParams {
    m: u32,
    n: u32,
    k: u32,
    flags: u32,
    alpha: f32,
    heads: u32,
    k_split: u32,
    /// `split_epilogue`: the splits whose partials it sums.
    splits: u32,
    a: OperandParams,
    b: OperandParams,
    c: OperandParams,
}

/// Flag bits of `shaders/matmul.wgsl` past the operand ones.
const BIAS: u32 = 8;
const COLUMN_SUMS: u32 = 16;
const GELU: u32 = 32;
const GELU_GRAD: u32 = 64;
const RESIDUAL: u32 = 128;

/// What a matmul does besides the product (see `shaders/matmul.wgsl`).
enum Epilogue<'a> {
    None,
    Bias(&'a GpuTensor),
    BiasGelu {
        bias: &'a GpuTensor,
        act: &'a GpuTensor,
    },
    GeluGrad {
        pre: &'a GpuTensor,
    },
    ColumnSums(&'a GpuTensor),
    BiasResidual {
        bias: &'a GpuTensor,
        residual: &'a GpuTensor,
    },
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Default)]
struct OperandParams {
    offset: u32,
    ld: u32,
    group_stride: u32,
    head_stride: u32,
}

impl OperandParams {
    fn new(op: &crate::backend::Operand, ld: usize) -> Self {
        OperandParams {
            offset: u(op.offset),
            ld: u(ld),
            group_stride: u(op.group_stride),
            head_stride: u(op.head_stride),
        }
    }
}

/// A matmul dispatch, with the bias epilogue when `bias` is given.
/// C (+)= alpha op(A) op(B), with an epilogue (`shaders/matmul.wgsl`).
fn matmul_with(
    gpu: &GpuBackend,
    a: &GpuTensor,
    b: &GpuTensor,
    epilogue: Epilogue,
    c: &mut GpuTensor,
    s: &Matmul,
) {
    s.check((a.len(), b.len(), c.len()));
    if !matches!(epilogue, Epilogue::None) {
        assert!(s.batch == 1, "matmul: epilogues are for one product");
    }
    // What the epilogue reads and writes; A stands in for an input
    // (bound, never read) and a spare buffer for an output.
    let spare = &gpu.spare;
    let (flag, input, output, residual) = match epilogue {
        Epilogue::None => (0, a, spare, a),
        Epilogue::Bias(bias) => (BIAS, bias, spare, a),
        Epilogue::BiasGelu { bias, act } => (BIAS | GELU, bias, act, a),
        Epilogue::GeluGrad { pre } => (GELU_GRAD, pre, spare, a),
        Epilogue::ColumnSums(sums) => (COLUMN_SUMS, a, sums, a),
        Epilogue::BiasResidual { bias, residual } => (BIAS | RESIDUAL, bias, spare, residual),
    };
    let flags = s.trans_a as u32 | (s.trans_b as u32) << 1 | (s.accumulate as u32) << 2 | flag;
    let [lda, ldb, ldc] = s.row_strides();
    let params = MatmulParams {
        m: u(s.m),
        n: u(s.n),
        k: u(s.k),
        flags,
        alpha: s.alpha,
        heads: u(s.heads),
        k_split: 0,
        splits: 0,
        a: OperandParams::new(&s.a, lda),
        b: OperandParams::new(&s.b, ldb),
        c: OperandParams::new(&s.c, ldc),
    };
    // An epilogue is for one product, so `batch == 1` with one.
    let splittable = s.batch == 1 && s.c.offset == 0 && ldc == s.n;
    let plan = matmul_plan::plan(gpu.matmul_kernel(), s.m, s.n, s.k, s.batch, splittable);
    if let Some(per) = plan.k_split {
        return split_matmul(gpu, a, b, epilogue, c, s, params, plan, per);
    }
    let entry = plan.tile.entry();
    gpu.count_matmul(entry, plan.workgroups(s.m, s.n, s.k, s.batch) as u64);
    gpu.dispatch(
        "matmul",
        entry,
        &params,
        &[&a.0, &b.0, &c.0, &input.0, &output.0, &residual.0],
        plan.grid(s.m, s.n, s.k, s.batch).map(u),
    );
}

/// `matmul_with` by split-K (see matmul.wgsl): each split's partial
/// product over `per` of k, then a second pass adds them in order:
/// `split_sum` (with their column sums), which scales and accumulates,
/// or, for another epilogue, `split_epilogue`, which applies it.
#[allow(clippy::too_many_arguments)]
fn split_matmul(
    gpu: &GpuBackend,
    a: &GpuTensor,
    b: &GpuTensor,
    epilogue: Epilogue,
    c: &mut GpuTensor,
    s: &Matmul,
    params: MatmulParams,
    plan: MatmulPlan,
    per: usize,
) {
    let splits = s.k.div_ceil(per);
    let (sum_cols, sums) = match epilogue {
        Epilogue::ColumnSums(sums) => (s.n, sums),
        _ => (0, &gpu.spare),
    };
    let product = s.m * s.n;
    let partials = gpu.scratch(splits * (product + sum_cols));
    let split_params = MatmulParams {
        k_split: u(per),
        ..params
    };
    let entry = plan.tile.entry();
    let workgroups = plan.workgroups(s.m, s.n, s.k, s.batch) as u64;
    gpu.count_matmul(&format!("{entry}+split"), workgroups);
    gpu.dispatch(
        "matmul",
        entry,
        &split_params,
        &[&a.0, &b.0, &c.0, &a.0, &partials.0, &a.0],
        plan.grid(s.m, s.n, s.k, s.batch).map(u),
    );
    let (input, output, residual) = match epilogue {
        Epilogue::None | Epilogue::ColumnSums(_) => {
            reduce::split_sum(gpu, &partials, c, sums, sum_cols, splits, s);
            return;
        }
        Epilogue::Bias(bias) => (bias, &gpu.spare, a),
        Epilogue::BiasGelu { bias, act } => (bias, act, a),
        Epilogue::GeluGrad { pre } => (pre, &gpu.spare, a),
        Epilogue::BiasResidual { bias, residual } => (bias, &gpu.spare, residual),
    };
    // The partials are bound as A; B is unused.
    let epilogue_params = MatmulParams {
        splits: u(splits),
        ..params
    };
    gpu.dispatch(
        "matmul",
        "split_epilogue",
        &epilogue_params,
        &[&partials.0, &c.0, &input.0, &output.0, &residual.0],
        gpu.grid_for(product),
    );
}

pub(super) fn matmul(
    gpu: &GpuBackend,
    a: &GpuTensor,
    b: &GpuTensor,
    c: &mut GpuTensor,
    s: &Matmul,
) {
    matmul_with(gpu, a, b, Epilogue::None, c, s);
}

pub(super) fn matmul_bias(
    gpu: &GpuBackend,
    a: &GpuTensor,
    b: &GpuTensor,
    bias: &GpuTensor,
    c: &mut GpuTensor,
    s: &Matmul,
) {
    assert!(bias.len() == s.n, "matmul_bias: one bias per column");
    matmul_with(gpu, a, b, Epilogue::Bias(bias), c, s);
}

pub(super) fn matmul_bias_residual(
    gpu: &GpuBackend,
    a: &GpuTensor,
    b: &GpuTensor,
    bias: &GpuTensor,
    residual: &GpuTensor,
    c: &mut GpuTensor,
    s: &Matmul,
) {
    assert!(
        bias.len() == s.n && residual.len() == c.len() && c.len() == s.m * s.n && s.c.offset == 0,
        "matmul_bias_residual: one bias per column, a packed C and a residual as large"
    );
    matmul_with(gpu, a, b, Epilogue::BiasResidual { bias, residual }, c, s);
}

pub(super) fn matmul_bias_gelu(
    gpu: &GpuBackend,
    a: &GpuTensor,
    b: &GpuTensor,
    bias: &GpuTensor,
    c: &mut GpuTensor,
    act: &mut GpuTensor,
    s: &Matmul,
) {
    assert!(
        bias.len() == s.n && act.len() >= s.m * s.n,
        "matmul_bias_gelu: one bias per column, an output as large as C"
    );
    matmul_with(gpu, a, b, Epilogue::BiasGelu { bias, act }, c, s);
}

pub(super) fn matmul_gelu_backward(
    gpu: &GpuBackend,
    a: &GpuTensor,
    b: &GpuTensor,
    pre: &GpuTensor,
    c: &mut GpuTensor,
    s: &Matmul,
) {
    s.check_gelu_backward(pre.len());
    matmul_with(gpu, a, b, Epilogue::GeluGrad { pre }, c, s);
}

pub(super) fn matmul_column_sums(
    gpu: &GpuBackend,
    a: &GpuTensor,
    b: &GpuTensor,
    c: &mut GpuTensor,
    sums: &mut GpuTensor,
    s: &Matmul,
) {
    s.check_column_sums(sums.len());
    matmul_with(gpu, a, b, Epilogue::ColumnSums(sums), c, s);
}
