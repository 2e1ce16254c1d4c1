//! `Backend` for the GPU: each op fills its kernel's parameter block (laid
//! out as the `Params` struct of its `shaders/*.wgsl` file) and records the
//! dispatch.

use super::matmul_plan::{self, MatmulPlan};
use super::{GpuBackend, GpuIds, GpuTensor, PendingRead, describe};
use crate::backend::{
    AdamWStep, AttentionShape, Backend, BackendKind, BeamStep, CachedAttention, Candidates,
    CellGates, ChoiceRule, DeviceCounters, HeadLayout, LstmStep, Matmul, Reduce, SoftmaxRows,
    Storage, TokenChoice, TokenIndex, VocabSubsets, WorkgroupCounts,
};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct ElementwiseParams {
    len: u32,
    cols: u32,
    alpha: f32,
    beta: f32,
}

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

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct SequenceParams {
    rows: u32,
    per_sequence: u32,
    pad: u32,
    alpha: f32,
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

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Default)]
struct ReduceParams {
    len: u32,
    cols: u32,
    chunk: u32,
    op: u32,
    out_index: u32,
    accumulate: u32,
    scale: f32,
    _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct LayerNormParams {
    rows: u32,
    cols: u32,
    eps: f32,
    accumulate: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct SoftmaxParams {
    rows: u32,
    cols: u32,
    q_len: u32,
    heads: u32,
    causal: u32,
    use_mask: u32,
    accumulate: u32,
    _pad: u32,
}

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

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct HeadsParams {
    batch: u32,
    seq: u32,
    heads: u32,
    head_dim: u32,
    row_stride: u32,
    col_offset: u32,
    accumulate: u32,
    _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct ChooseParams {
    rows: u32,
    vocab: u32,
    step: u32,
    steps: u32,
    sample: u32,
    top_k: u32,
    temperature: f32,
    top_p: f32,
    seed_lo: u32,
    seed_hi: u32,
    first_row: u32,
    banned: u32,
    bos: u32,
    eos: u32,
    pad: u32,
    _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct BeamParams {
    images: u32,
    width: u32,
    n_best: u32,
    count: u32,
    steps: u32,
    step: u32,
    eos: u32,
    pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct GumbelParams {
    len: u32,
    vocab: u32,
    positions: u32,
    first_row: u32,
    seed_lo: u32,
    seed_hi: u32,
    tau: f32,
    _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct EmbeddingParams {
    len: u32,
    dim: u32,
    accumulate: u32,
    _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct LogprobParams {
    rows: u32,
    vocab: u32,
    words: u32,
    accumulate: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct AdamWParams {
    len: u32,
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
    bias_correction1: f32,
    bias_correction2: f32,
    max_norm: f32,
    _pad: [u32; 3],
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct NormalizeParams {
    rows: u32,
    cols: u32,
    accumulate: u32,
    _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct LstmParams {
    rows: u32,
    hidden: u32,
    gates_offset: u32,
    gates_stride: u32,
    prev: u32,
    next: u32,
    state_stride: u32,
    maxout: u32,
}

impl LstmParams {
    fn new(s: &LstmStep) -> Self {
        LstmParams {
            rows: u(s.rows),
            hidden: u(s.hidden),
            gates_offset: u(s.gates_offset),
            gates_stride: u(s.gates_stride),
            prev: u(s.prev),
            next: u(s.next),
            state_stride: u(s.state_stride),
            maxout: u32::from(s.cell == CellGates::Maxout),
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct PoolParams {
    len: u32,
    cols: u32,
    group: u32,
    accumulate: u32,
}

/// Rows per block of the two-pass column reductions (ROW_BLOCK in the shaders).
const ROW_BLOCK: usize = 64;
/// Partials a full reduction's first pass produces at most.
const MAX_PARTIALS: usize = 1024;

fn u(x: usize) -> u32 {
    u32::try_from(x).expect("size exceeds u32: the WGSL kernels index with u32")
}

impl GpuBackend {
    /// A matmul dispatch, with the bias epilogue when `bias` is given.
    /// C (+)= alpha op(A) op(B), with an epilogue (`shaders/matmul.wgsl`).
    fn matmul_with(
        &self,
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
        let spare = &self.spare;
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
        let plan = matmul_plan::plan(self.matmul_kernel(), s.m, s.n, s.k, s.batch, splittable);
        if let Some(per) = plan.k_split {
            return self.split_matmul(a, b, epilogue, c, s, params, plan, per);
        }
        let entry = plan.tile.entry();
        self.count_matmul(entry, plan.workgroups(s.m, s.n, s.k, s.batch) as u64);
        self.dispatch(
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
        &self,
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
            _ => (0, &self.spare),
        };
        let product = s.m * s.n;
        let partials = self.scratch(splits * (product + sum_cols));
        let split_params = MatmulParams {
            k_split: u(per),
            ..params
        };
        let entry = plan.tile.entry();
        let workgroups = plan.workgroups(s.m, s.n, s.k, s.batch) as u64;
        self.count_matmul(&format!("{entry}+split"), workgroups);
        self.dispatch(
            "matmul",
            entry,
            &split_params,
            &[&a.0, &b.0, &c.0, &a.0, &partials.0, &a.0],
            plan.grid(s.m, s.n, s.k, s.batch).map(u),
        );
        let (input, output, residual) = match epilogue {
            Epilogue::None | Epilogue::ColumnSums(_) => {
                let sum = ReduceParams {
                    len: u(product),
                    cols: u(sum_cols),
                    chunk: u(splits),
                    accumulate: s.accumulate as u32,
                    scale: s.alpha,
                    ..Default::default()
                };
                self.dispatch(
                    "reduce",
                    "split_sum",
                    &sum,
                    &[&partials.0, &c.0, &sums.0],
                    self.grid_for(product + sum_cols),
                );
                return;
            }
            Epilogue::Bias(bias) => (bias, &self.spare, a),
            Epilogue::BiasGelu { bias, act } => (bias, act, a),
            Epilogue::GeluGrad { pre } => (pre, &self.spare, a),
            Epilogue::BiasResidual { bias, residual } => (bias, &self.spare, residual),
        };
        // The partials are bound as A; B is unused.
        let epilogue_params = MatmulParams {
            splits: u(splits),
            ..params
        };
        self.dispatch(
            "matmul",
            "split_epilogue",
            &epilogue_params,
            &[&partials.0, &c.0, &input.0, &output.0, &residual.0],
            self.grid_for(product),
        );
    }

    fn elementwise(
        &self,
        entry: &'static str,
        len: usize,
        cols: usize,
        alpha: f32,
        beta: f32,
        bufs: &[&super::GpuBuffer],
    ) {
        let params = ElementwiseParams {
            len: u(len),
            cols: u(cols),
            alpha,
            beta,
        };
        self.dispatch("elementwise", entry, &params, bufs, self.grid_for(len));
    }
}

impl Backend for GpuBackend {
    type Tensor = GpuTensor;
    type Ids = GpuIds;
    type PendingIds = PendingRead;

    fn kind(&self) -> BackendKind {
        BackendKind::Gpu
    }

    fn adapter_name(&self) -> String {
        describe(&self.info)
    }

    fn zeros(&self, len: usize) -> GpuTensor {
        GpuTensor(self.zeroed(len))
    }

    fn tensor(&self, data: &[f32]) -> GpuTensor {
        self.new_tensor(data)
    }

    fn ids(&self, data: &[u32]) -> GpuIds {
        self.new_ids(data)
    }

    fn tensor_group(&self, data: &[&[f32]]) -> Vec<GpuTensor> {
        self.group(data)
    }

    fn span(&self, group: &[&GpuTensor]) -> Option<GpuTensor> {
        self.covering(group)
    }

    fn write(&self, dst: &mut GpuTensor, data: &[f32]) {
        assert_eq!(dst.len(), data.len(), "write: length mismatch");
        self.write_bytes(&dst.0, bytemuck::cast_slice(data));
    }

    fn to_vec(&self, src: &GpuTensor) -> Vec<f32> {
        bytemuck::pod_collect_to_vec(&self.read_bytes(&src.0))
    }

    fn ids_to_vec(&self, src: &GpuIds) -> Vec<u32> {
        bytemuck::pod_collect_to_vec(&self.read_bytes(&src.0))
    }

    fn begin_ids_read(&self, src: &GpuIds) -> PendingRead {
        self.begin_read(&src.0)
    }

    fn poll_ids_read(&self, pending: &mut PendingRead) -> Option<Vec<u32>> {
        pending
            .poll()
            .map(|bytes| bytemuck::pod_collect_to_vec(&bytes))
    }

    fn flush(&self) {
        GpuBackend::submit(self);
        self.wait();
    }

    fn submit(&self) {
        GpuBackend::submit(self);
    }

    fn counters(&self) -> Option<DeviceCounters> {
        Some(GpuBackend::counters(self))
    }

    fn matmul_workgroups(&self) -> Option<WorkgroupCounts> {
        Some(GpuBackend::matmul_workgroups(self))
    }

    fn start_kernel_profile(&self) -> bool {
        GpuBackend::start_kernel_profile(self)
    }
    fn finish_kernel_profile(&self) -> Option<crate::kernel_profile::KernelProfile> {
        GpuBackend::finish_kernel_profile(self)
    }
    fn device_memory_bytes(&self) -> Option<u64> {
        Some(GpuBackend::device_memory_bytes(self))
    }

    fn fill(&self, x: &mut GpuTensor, value: f32) {
        self.elementwise("fill", x.len(), 0, value, 0.0, &[&x.0]);
    }

    fn scale(&self, x: &mut GpuTensor, alpha: f32) {
        self.elementwise("scale", x.len(), 0, alpha, 0.0, &[&x.0]);
    }

    fn axpby(&self, alpha: f32, x: &GpuTensor, beta: f32, y: &mut GpuTensor) {
        assert_eq!(x.len(), y.len(), "axpby: length mismatch");
        self.elementwise("axpby", y.len(), 0, alpha, beta, &[&x.0, &y.0]);
    }

    fn add(&self, alpha: f32, a: &GpuTensor, beta: f32, b: &GpuTensor, out: &mut GpuTensor) {
        assert!(
            a.len() == out.len() && b.len() == out.len(),
            "add: length mismatch"
        );
        self.elementwise("add", out.len(), 0, alpha, beta, &[&a.0, &b.0, &out.0]);
    }

    fn mul(&self, alpha: f32, a: &GpuTensor, b: &GpuTensor, out: &mut GpuTensor) {
        assert!(
            a.len() == out.len() && b.len() == out.len(),
            "mul: length mismatch"
        );
        self.elementwise("mul", out.len(), 0, alpha, 0.0, &[&a.0, &b.0, &out.0]);
    }

    fn add_bias(&self, y: &mut GpuTensor, bias: &GpuTensor) {
        assert_eq!(
            y.len() % bias.len().max(1),
            0,
            "add_bias: rows are not whole"
        );
        self.elementwise("add_bias", y.len(), bias.len(), 0.0, 0.0, &[&bias.0, &y.0]);
    }

    fn gelu(&self, x: &GpuTensor, y: &mut GpuTensor) {
        self.elementwise("gelu", y.len(), 0, 0.0, 0.0, &[&x.0, &y.0]);
    }

    fn tanh(&self, x: &GpuTensor, y: &mut GpuTensor) {
        self.elementwise("tanh_forward", y.len(), 0, 0.0, 0.0, &[&x.0, &y.0]);
    }

    fn tanh_backward(&self, x: &GpuTensor, dy: &GpuTensor, dx: &mut GpuTensor) {
        self.elementwise(
            "tanh_backward",
            dx.len(),
            0,
            0.0,
            0.0,
            &[&x.0, &dy.0, &dx.0],
        );
    }

    fn gelu_erf(&self, x: &GpuTensor, y: &mut GpuTensor) {
        self.elementwise("gelu_erf_forward", y.len(), 0, 0.0, 0.0, &[&x.0, &y.0]);
    }

    fn gelu_erf_backward(&self, x: &GpuTensor, dy: &GpuTensor, dx: &mut GpuTensor) {
        self.elementwise(
            "gelu_erf_backward",
            dx.len(),
            0,
            0.0,
            0.0,
            &[&x.0, &dy.0, &dx.0],
        );
    }

    fn quick_gelu(&self, x: &GpuTensor, y: &mut GpuTensor) {
        self.elementwise("quick_gelu_forward", y.len(), 0, 0.0, 0.0, &[&x.0, &y.0]);
    }

    fn quick_gelu_backward(&self, x: &GpuTensor, dy: &GpuTensor, dx: &mut GpuTensor) {
        self.elementwise(
            "quick_gelu_backward",
            dx.len(),
            0,
            0.0,
            0.0,
            &[&x.0, &dy.0, &dx.0],
        );
    }

    fn relu(&self, x: &GpuTensor, y: &mut GpuTensor) {
        self.elementwise("relu_forward", y.len(), 0, 0.0, 0.0, &[&x.0, &y.0]);
    }

    fn relu_backward(&self, x: &GpuTensor, dy: &GpuTensor, dx: &mut GpuTensor) {
        self.elementwise(
            "relu_backward",
            dx.len(),
            0,
            0.0,
            0.0,
            &[&x.0, &dy.0, &dx.0],
        );
    }

    fn gelu_backward(&self, x: &GpuTensor, dy: &GpuTensor, dx: &mut GpuTensor, accumulate: bool) {
        let beta = if accumulate { 1.0 } else { 0.0 };
        self.elementwise(
            "gelu_backward",
            dx.len(),
            0,
            0.0,
            beta,
            &[&x.0, &dy.0, &dx.0],
        );
    }

    fn scale_by_exp(
        &self,
        log_scale: &GpuTensor,
        x: &GpuTensor,
        y: &mut GpuTensor,
        accumulate: bool,
    ) {
        let beta = if accumulate { 1.0 } else { 0.0 };
        self.elementwise(
            "scale_by_exp",
            y.len(),
            0,
            0.0,
            beta,
            &[&x.0, &y.0, &log_scale.0],
        );
    }

    fn clamp(&self, x: &mut GpuTensor, lo: f32, hi: f32) {
        self.elementwise("clamp_values", x.len(), 0, lo, hi, &[&x.0]);
    }

    fn l2_normalize(&self, x: &GpuTensor, y: &mut GpuTensor, norm: &mut GpuTensor, cols: usize) {
        let rows = x.len() / cols;
        let params = NormalizeParams {
            rows: u(rows),
            cols: u(cols),
            accumulate: 0,
            _pad: 0,
        };
        let bufs = [&x.0, &y.0, &norm.0];
        self.dispatch(
            "normalize",
            "l2_normalize_forward",
            &params,
            &bufs,
            self.grid(rows),
        );
    }

    fn l2_normalize_backward(
        &self,
        y: &GpuTensor,
        norm: &GpuTensor,
        dy: &GpuTensor,
        dx: &mut GpuTensor,
        cols: usize,
        accumulate: bool,
    ) {
        let rows = y.len() / cols;
        let params = NormalizeParams {
            rows: u(rows),
            cols: u(cols),
            accumulate: accumulate as u32,
            _pad: 0,
        };
        let bufs = [&y.0, &norm.0, &dy.0, &dx.0];
        self.dispatch(
            "normalize",
            "l2_normalize_backward",
            &params,
            &bufs,
            self.grid(rows),
        );
    }

    fn lstm_cell(
        &self,
        gates: &mut GpuTensor,
        cells: &mut GpuTensor,
        hidden: &mut GpuTensor,
        step: &LstmStep,
    ) {
        step.check(gates.len(), &[cells.len(), hidden.len()]);
        let grid = self.grid_for(step.rows * step.hidden);
        let params = LstmParams::new(step);
        let bufs = [&gates.0, &cells.0, &hidden.0];
        self.dispatch("lstm", "lstm_cell", &params, &bufs, grid);
    }

    fn lstm_cell_backward(
        &self,
        gates: &GpuTensor,
        cells: &GpuTensor,
        d_hidden: &GpuTensor,
        d_cell: &mut GpuTensor,
        d_gates: &mut GpuTensor,
        step: &LstmStep,
    ) {
        step.check_backward(
            gates.len(),
            d_gates.len(),
            &[cells.len(), d_hidden.len()],
            d_cell.len(),
        );
        let grid = self.grid_for(step.rows * step.hidden);
        let params = LstmParams::new(step);
        let bufs = [&gates.0, &cells.0, &d_hidden.0, &d_cell.0, &d_gates.0];
        self.dispatch("lstm", "lstm_cell_backward", &params, &bufs, grid);
    }

    fn mean_pool(&self, x: &GpuTensor, y: &mut GpuTensor, group: usize, cols: usize) {
        let params = PoolParams {
            len: u(y.len()),
            cols: u(cols),
            group: u(group),
            accumulate: 0,
        };
        self.dispatch(
            "pool",
            "mean_pool",
            &params,
            &[&x.0, &y.0],
            self.grid_for(y.len()),
        );
    }

    fn mean_pool_backward(
        &self,
        dy: &GpuTensor,
        dx: &mut GpuTensor,
        group: usize,
        cols: usize,
        accumulate: bool,
    ) {
        let params = PoolParams {
            len: u(dx.len()),
            cols: u(cols),
            group: u(group),
            accumulate: accumulate as u32,
        };
        let grid = self.grid_for(dx.len());
        self.dispatch("pool", "mean_pool_backward", &params, &[&dy.0, &dx.0], grid);
    }

    fn matmul(&self, a: &GpuTensor, b: &GpuTensor, c: &mut GpuTensor, s: &Matmul) {
        self.matmul_with(a, b, Epilogue::None, c, s);
    }

    fn matmul_bias(
        &self,
        a: &GpuTensor,
        b: &GpuTensor,
        bias: &GpuTensor,
        c: &mut GpuTensor,
        s: &Matmul,
    ) {
        assert!(bias.len() == s.n, "matmul_bias: one bias per column");
        self.matmul_with(a, b, Epilogue::Bias(bias), c, s);
    }

    fn matmul_bias_residual(
        &self,
        a: &GpuTensor,
        b: &GpuTensor,
        bias: &GpuTensor,
        residual: &GpuTensor,
        c: &mut GpuTensor,
        s: &Matmul,
    ) {
        assert!(
            bias.len() == s.n
                && residual.len() == c.len()
                && c.len() == s.m * s.n
                && s.c.offset == 0,
            "matmul_bias_residual: one bias per column, a packed C and a residual as large"
        );
        self.matmul_with(a, b, Epilogue::BiasResidual { bias, residual }, c, s);
    }

    fn matmul_bias_gelu(
        &self,
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
        self.matmul_with(a, b, Epilogue::BiasGelu { bias, act }, c, s);
    }

    fn matmul_gelu_backward(
        &self,
        a: &GpuTensor,
        b: &GpuTensor,
        pre: &GpuTensor,
        c: &mut GpuTensor,
        s: &Matmul,
    ) {
        s.check_gelu_backward(pre.len());
        self.matmul_with(a, b, Epilogue::GeluGrad { pre }, c, s);
    }

    fn matmul_column_sums(
        &self,
        a: &GpuTensor,
        b: &GpuTensor,
        c: &mut GpuTensor,
        sums: &mut GpuTensor,
        s: &Matmul,
    ) {
        s.check_column_sums(sums.len());
        self.matmul_with(a, b, Epilogue::ColumnSums(sums), c, s);
    }

    fn reduce_parts(
        &self,
        parts: &[&GpuTensor],
        op: Reduce,
        out: &mut GpuTensor,
        out_index: usize,
    ) {
        assert!(
            out_index < out.len(),
            "reduce: out_index {out_index} outside an output of {}",
            out.len()
        );
        // Each part's chunks into one run of partials, then one final pass.
        let n: usize = parts.iter().map(|x| x.len()).sum();
        let chunk = n.div_ceil(MAX_PARTIALS).next_multiple_of(256).max(256);
        let chunks = |x: &GpuTensor| x.len().div_ceil(chunk).max(1);
        let total_chunks: usize = parts.iter().map(|x| chunks(x)).sum();
        let partials = self.scratch(total_chunks.max(1));
        let (first_op, final_op) = match op {
            Reduce::Sum | Reduce::Mean => (0, 0),
            Reduce::Max => (1, 1),
            Reduce::SumSquares => (2, 0),
        };
        let mut first = 0;
        for x in parts {
            let params = ReduceParams {
                len: u(x.len()),
                chunk: u(chunk),
                op: first_op,
                out_index: u(first),
                ..Default::default()
            };
            self.dispatch(
                "reduce",
                "reduce_partials",
                &params,
                &[&x.0, &partials.0],
                self.grid(chunks(x)),
            );
            first += chunks(x);
        }
        let scale = if op == Reduce::Mean {
            1.0 / n.max(1) as f32
        } else {
            1.0
        };
        let params = ReduceParams {
            len: u(total_chunks),
            op: final_op,
            out_index: u(out_index),
            scale,
            ..Default::default()
        };
        self.dispatch(
            "reduce",
            "reduce_final",
            &params,
            &[&partials.0, &out.0],
            [1, 1, 1],
        );
    }

    fn column_sum(
        &self,
        x: &GpuTensor,
        rows: usize,
        cols: usize,
        out: &mut GpuTensor,
        accumulate: bool,
    ) {
        assert!(
            x.len() >= rows * cols && out.len() >= cols,
            "column_sum: shapes do not fit"
        );
        // In two passes when the rows span more than one block.
        let blocks = rows.div_ceil(ROW_BLOCK);
        let col_groups = cols.div_ceil(256) as u32;
        let sum = |src: &GpuTensor, rows: usize| {
            let params = ReduceParams {
                len: u(rows),
                cols: u(cols),
                accumulate: accumulate as u32,
                ..Default::default()
            };
            self.dispatch(
                "reduce",
                "column_sum",
                &params,
                &[&src.0, &out.0],
                [col_groups, 1, 1],
            );
        };
        if blocks <= 1 {
            sum(x, rows);
            return;
        }
        let partials = self.scratch(blocks * cols);
        let params = ReduceParams {
            len: u(rows),
            cols: u(cols),
            ..Default::default()
        };
        self.dispatch(
            "reduce",
            "column_partials",
            &params,
            &[&x.0, &partials.0],
            [col_groups, u(blocks), 1],
        );
        sum(&partials, blocks);
    }

    fn layer_norm(
        &self,
        x: &GpuTensor,
        gamma: &GpuTensor,
        beta: &GpuTensor,
        y: &mut GpuTensor,
        mean: &mut GpuTensor,
        rstd: &mut GpuTensor,
        cols: usize,
        eps: f32,
    ) {
        let rows = x.len() / cols;
        let params = LayerNormParams {
            rows: u(rows),
            cols: u(cols),
            eps,
            accumulate: 0,
        };
        let bufs = [&x.0, &gamma.0, &beta.0, &y.0, &mean.0, &rstd.0];
        self.dispatch(
            "layernorm",
            "layer_norm_forward",
            &params,
            &bufs,
            self.grid(rows),
        );
    }

    fn layer_norm_backward(
        &self,
        dy: &GpuTensor,
        x: &GpuTensor,
        gamma: &GpuTensor,
        mean: &GpuTensor,
        rstd: &GpuTensor,
        dx: &mut GpuTensor,
        dgamma: &mut GpuTensor,
        dbeta: &mut GpuTensor,
        cols: usize,
        accumulate_dx: bool,
    ) {
        let rows = x.len() / cols;
        let params = LayerNormParams {
            rows: u(rows),
            cols: u(cols),
            eps: 0.0,
            accumulate: accumulate_dx as u32,
        };
        let bufs = [&dy.0, &x.0, &gamma.0, &mean.0, &rstd.0, &dx.0];
        self.dispatch(
            "layernorm",
            "layer_norm_backward",
            &params,
            &bufs,
            self.grid(rows),
        );
        if dgamma.is_empty() {
            return;
        }
        let blocks = rows.div_ceil(ROW_BLOCK);
        let dgamma_partial = self.scratch(blocks * cols);
        let dbeta_partial = self.scratch(blocks * cols);
        let bufs = [
            &dy.0,
            &x.0,
            &mean.0,
            &rstd.0,
            &dgamma_partial.0,
            &dbeta_partial.0,
        ];
        let groups = [u(cols.div_ceil(256)), u(blocks), 1];
        self.dispatch(
            "layernorm",
            "layer_norm_param_partials",
            &params,
            &bufs,
            groups,
        );
        let params = LayerNormParams {
            rows: u(blocks),
            ..params
        };
        let bufs = [&dgamma_partial.0, &dbeta_partial.0, &dgamma.0, &dbeta.0];
        self.dispatch(
            "layernorm",
            "layer_norm_param_sums",
            &params,
            &bufs,
            [u(cols.div_ceil(256)), 1, 1],
        );
    }

    fn softmax(
        &self,
        x: &GpuTensor,
        y: &mut GpuTensor,
        r: &SoftmaxRows,
        key_mask: Option<&GpuIds>,
    ) {
        let params = SoftmaxParams {
            rows: u(r.rows),
            cols: u(r.cols),
            q_len: u(r.q_len),
            heads: u(r.heads),
            causal: r.causal as u32,
            use_mask: key_mask.is_some() as u32,
            accumulate: 0,
            _pad: 0,
        };
        let mask = &key_mask.unwrap_or(&self.no_mask).0;
        self.dispatch(
            "softmax",
            "softmax_forward",
            &params,
            &[&x.0, mask, &y.0],
            self.grid(r.rows),
        );
    }

    fn softmax_backward(
        &self,
        y: &GpuTensor,
        dy: &GpuTensor,
        dx: &mut GpuTensor,
        cols: usize,
        accumulate: bool,
    ) {
        let rows = y.len() / cols;
        let params = SoftmaxParams {
            rows: u(rows),
            cols: u(cols),
            q_len: u(rows.max(1)),
            heads: 1,
            causal: 0,
            use_mask: 0,
            accumulate: accumulate as u32,
            _pad: 0,
        };
        self.dispatch(
            "softmax",
            "softmax_backward",
            &params,
            &[&y.0, &dy.0, &dx.0],
            self.grid(rows),
        );
    }

    fn attention(
        &self,
        qkv: &GpuTensor,
        key_mask: Option<&GpuIds>,
        out: &mut GpuTensor,
        lse: &mut GpuTensor,
        l: &AttentionShape,
    ) {
        l.check((qkv.len(), out.len(), lse.len()), key_mask.map(|m| m.len()));
        let params = SelfAttentionParams::new(l, key_mask.is_some());
        let mask = &key_mask.unwrap_or(&self.no_mask).0;
        self.dispatch(
            "attention",
            "attention_forward",
            &params,
            &[&qkv.0, mask, &out.0, &lse.0],
            self.grid(self_attention_groups(l)),
        );
    }

    fn attention_backward(
        &self,
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
        let mask = &key_mask.unwrap_or(&self.no_mask).0;
        let buffers = [&qkv.0, mask, &out.0, &lse.0, &d_out.0, &dqkv.0];
        let groups = self.grid(self_attention_groups(l));
        // The query rows of dqkv, then its key and value rows.
        self.dispatch(
            "attention",
            "attention_backward_queries",
            &params,
            &buffers,
            groups,
        );
        self.dispatch(
            "attention",
            "attention_backward_keys",
            &params,
            &buffers,
            groups,
        );
    }

    fn attend_cached(
        &self,
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
        self.dispatch(
            "attention",
            "attend_cached",
            &params,
            &[&qkv.0, &keys.0, &values.0, &out.0],
            self.grid(l.rows * l.heads),
        );
    }

    fn tokens_to_heads(&self, src: &GpuTensor, dst: &mut GpuTensor, l: &HeadLayout) {
        let params = heads_params(l, false);
        self.dispatch(
            "heads",
            "tokens_to_heads",
            &params,
            &[&src.0, &dst.0],
            self.grid_for(l.len()),
        );
    }

    fn heads_to_tokens(
        &self,
        src: &GpuTensor,
        dst: &mut GpuTensor,
        l: &HeadLayout,
        accumulate: bool,
    ) {
        let params = heads_params(l, accumulate);
        self.dispatch(
            "heads",
            "heads_to_tokens",
            &params,
            &[&src.0, &dst.0],
            self.grid_for(l.len()),
        );
    }

    fn embedding(
        &self,
        table: &GpuTensor,
        ids: &GpuIds,
        out: &mut GpuTensor,
        dim: usize,
        accumulate: bool,
    ) {
        let len = ids.len() * dim;
        let params = EmbeddingParams {
            len: u(len),
            dim: u(dim),
            accumulate: accumulate as u32,
            _pad: 0,
        };
        self.dispatch(
            "embedding",
            "embedding_forward",
            &params,
            &[&table.0, &ids.0, &out.0],
            self.grid_for(len),
        );
    }

    fn softmax_entropy(
        &self,
        logits: &GpuTensor,
        vocab: usize,
        entropy: &mut GpuTensor,
        lse: &mut GpuTensor,
    ) {
        let rows = entropy.len();
        assert!(
            logits.len() >= rows * vocab && lse.len() >= rows,
            "softmax_entropy: shapes do not fit"
        );
        let params = LogprobParams {
            rows: u(rows),
            vocab: u(vocab),
            words: 0,
            accumulate: 0,
        };
        self.dispatch(
            "logprob",
            "softmax_entropy",
            &params,
            &[&logits.0, &entropy.0, &lse.0],
            self.grid(rows),
        );
    }

    fn softmax_entropy_backward(
        &self,
        logits: &GpuTensor,
        vocab: usize,
        entropy: &GpuTensor,
        lse: &GpuTensor,
        d_entropy: &GpuTensor,
        dlogits: &mut GpuTensor,
        accumulate: bool,
    ) {
        let rows = entropy.len();
        assert!(
            logits.len() >= rows * vocab && dlogits.len() >= rows * vocab,
            "softmax_entropy_backward: shapes do not fit"
        );
        let params = LogprobParams {
            rows: u(rows),
            vocab: u(vocab),
            words: 0,
            accumulate: accumulate as u32,
        };
        self.dispatch(
            "logprob",
            "softmax_entropy_backward",
            &params,
            &[&logits.0, &entropy.0, &lse.0, &d_entropy.0, &dlogits.0],
            self.grid_for(rows * vocab),
        );
    }

    fn spread_sequence_weights(
        &self,
        weights: &GpuTensor,
        ids: &GpuIds,
        per_sequence: usize,
        pad: u32,
        alpha: f32,
        coef: &mut GpuTensor,
    ) {
        let rows = ids.len();
        assert!(
            per_sequence > 0 && coef.len() >= rows && weights.len() >= rows.div_ceil(per_sequence),
            "spread_sequence_weights: shapes do not fit"
        );
        let params = SequenceParams {
            rows: u(rows),
            per_sequence: u(per_sequence),
            pad,
            alpha,
        };
        self.dispatch(
            "sequence",
            "spread_sequence_weights",
            &params,
            &[&weights.0, &ids.0, &coef.0],
            self.grid_for(rows),
        );
    }

    fn choose_tokens(
        &self,
        logits: &GpuTensor,
        choice: &TokenChoice,
        next: &mut GpuIds,
        history: &mut GpuIds,
        logprobs: &mut GpuTensor,
    ) {
        let (rule, sampling) = match choice.rule {
            ChoiceRule::Greedy => (0, None),
            ChoiceRule::Sample(s) => (1, Some(s)),
            ChoiceRule::Gumbel => (2, None),
        };
        let sampling = sampling.unwrap_or(crate::backend::Sampling {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
        });
        let params = ChooseParams {
            rows: u(choice.rows),
            vocab: u(choice.vocab),
            step: choice.step,
            steps: u(choice.steps),
            sample: rule,
            top_k: sampling.top_k,
            temperature: sampling.temperature,
            top_p: sampling.top_p,
            seed_lo: choice.seed as u32,
            seed_hi: (choice.seed >> 32) as u32,
            first_row: choice.first_row,
            banned: choice.banned,
            bos: choice.bos,
            eos: choice.eos,
            pad: choice.pad,
            _pad: 0,
        };
        self.dispatch(
            "choose",
            "choose_tokens",
            &params,
            &[&logits.0, &next.0, &history.0, &logprobs.0],
            self.grid(choice.rows),
        );
    }

    fn top_candidates(&self, logits: &GpuTensor, c: &Candidates, candidates: &mut GpuIds) {
        c.check((logits.len(), candidates.len()));
        let params = ChooseParams {
            rows: u(c.rows),
            vocab: u(c.vocab),
            top_k: u(c.count),
            banned: c.banned,
            bos: c.bos,
            pad: c.pad,
            ..ChooseParams::zeroed()
        };
        self.dispatch(
            "choose",
            "top_candidates",
            &params,
            &[&logits.0, &candidates.0],
            self.grid(c.rows),
        );
    }

    fn beam_step(
        &self,
        candidates: &GpuIds,
        step: &BeamStep,
        parents: &mut GpuIds,
        next: &mut GpuIds,
        state: &mut GpuIds,
    ) {
        step.check((candidates.len(), parents.len(), next.len(), state.len()));
        let params = BeamParams {
            images: u(step.images),
            width: u(step.width),
            n_best: u(step.n_best),
            count: u(step.count()),
            steps: u(step.steps),
            step: u(step.step),
            eos: step.eos,
            pad: step.pad,
        };
        self.dispatch(
            "beam",
            "beam_step",
            &params,
            &[&candidates.0, &parents.0, &next.0, &state.0],
            self.grid(step.images.div_ceil(64)),
        );
    }

    fn gumbel_logits(
        &self,
        logits: &GpuTensor,
        vocab: usize,
        positions: usize,
        seed: u64,
        first_row: u32,
        tau: f32,
        out: &mut GpuTensor,
    ) {
        let len = logits.len();
        assert!(
            out.len() == len && len.is_multiple_of(vocab * positions),
            "gumbel_logits: shapes do not fit"
        );
        let params = GumbelParams {
            len: u(len),
            vocab: u(vocab),
            positions: u(positions),
            first_row,
            seed_lo: seed as u32,
            seed_hi: (seed >> 32) as u32,
            tau,
            _pad: 0,
        };
        self.dispatch(
            "choose",
            "gumbel_logits",
            &params,
            &[&logits.0, &out.0],
            self.grid_for(len),
        );
    }

    fn embedding_backward(
        &self,
        dout: &GpuTensor,
        ids: &TokenIndex<Self>,
        dtable: &mut GpuTensor,
        dim: usize,
    ) {
        let len = ids.unique_len() * dim;
        let params = EmbeddingParams {
            len: u(len),
            dim: u(dim),
            accumulate: 1,
            _pad: 0,
        };
        let bufs = [
            &dout.0,
            &ids.unique.0,
            &ids.offsets.0,
            &ids.order.0,
            &dtable.0,
        ];
        self.dispatch(
            "embedding",
            "embedding_backward",
            &params,
            &bufs,
            self.grid_for(len),
        );
    }

    fn log_softmax_gather(
        &self,
        logits: &GpuTensor,
        targets: &GpuIds,
        subsets: &VocabSubsets<Self>,
        vocab: usize,
        logp: &mut GpuTensor,
        lse: &mut GpuTensor,
    ) {
        let rows = targets.len();
        let params = LogprobParams {
            rows: u(rows),
            vocab: u(vocab),
            words: u(subsets.words),
            accumulate: 0,
        };
        let bufs = [
            &logits.0,
            &targets.0,
            &subsets.row_subset.0,
            &subsets.bits.0,
            &logp.0,
            &lse.0,
        ];
        self.dispatch(
            "logprob",
            "log_softmax_gather",
            &params,
            &bufs,
            self.grid(rows),
        );
    }

    fn log_softmax_gather_backward(
        &self,
        logits: &GpuTensor,
        targets: &GpuIds,
        subsets: &VocabSubsets<Self>,
        vocab: usize,
        lse: &GpuTensor,
        dlogp: &GpuTensor,
        dlogits: &mut GpuTensor,
        accumulate: bool,
    ) {
        let rows = targets.len();
        let params = LogprobParams {
            rows: u(rows),
            vocab: u(vocab),
            words: u(subsets.words),
            accumulate: accumulate as u32,
        };
        let bufs = [
            &logits.0,
            &targets.0,
            &subsets.row_subset.0,
            &subsets.bits.0,
            &lse.0,
            &dlogp.0,
            &dlogits.0,
        ];
        self.dispatch(
            "logprob",
            "log_softmax_gather_backward",
            &params,
            &bufs,
            self.grid_for(rows * vocab),
        );
    }

    fn adamw(
        &self,
        param: &mut GpuTensor,
        grad: &GpuTensor,
        m: &mut GpuTensor,
        v: &mut GpuTensor,
        grad_sumsq: &GpuTensor,
        s: &AdamWStep,
    ) {
        let (bc1, bc2) = s.bias_corrections();
        let params = AdamWParams {
            len: u(param.len()),
            lr: s.lr,
            beta1: s.beta1,
            beta2: s.beta2,
            eps: s.eps,
            weight_decay: s.weight_decay,
            bias_correction1: bc1,
            bias_correction2: bc2,
            max_norm: s.max_norm,
            _pad: [0; 3],
        };
        let bufs = [&grad.0, &grad_sumsq.0, &param.0, &m.0, &v.0];
        self.dispatch(
            "adamw",
            "adamw_step",
            &params,
            &bufs,
            self.grid_for(param.len()),
        );
    }
}

fn heads_params(l: &HeadLayout, accumulate: bool) -> HeadsParams {
    HeadsParams {
        batch: u(l.batch),
        seq: u(l.seq),
        heads: u(l.heads),
        head_dim: u(l.head_dim),
        row_stride: u(l.row_stride),
        col_offset: u(l.col_offset),
        accumulate: accumulate as u32,
        _pad: 0,
    }
}
