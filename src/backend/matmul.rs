//! The shape of a (batched) matrix product and where its operands lie.

use super::HeadLayout;

/// Shape of a (batched) matrix multiply
/// `C[i] = alpha * op(A[i]) * op(B[i]) (+ C[i] if accumulate)`.
/// op(A) is m x k (A stored [m, k], or [k, m] if `trans_a`); op(B) is k x n
/// (B stored [k, n], or [n, k] if `trans_b`). Where each batch item's
/// matrices lie is its operand's [`Operand`]: packed one after another by
/// default, or, for attention, heads side by side in token-major rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Matmul {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    pub accumulate: bool,
    pub alpha: f32,
    /// Batch items come in groups of `heads`: item i is head `i % heads`
    /// of group `i / heads`. `batch` is a multiple of it.
    pub heads: usize,
    pub a: Operand,
    pub b: Operand,
    pub c: Operand,
}

/// Where one operand's matrices lie in its tensor: batch item i (head h of
/// group g, see [`Matmul::heads`]) starts at
/// `offset + g * group_stride + h * head_stride`, and its stored rows are
/// `row_stride` apart (0: rows packed, as many elements apart as a stored
/// row has).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operand {
    pub offset: usize,
    pub row_stride: usize,
    pub group_stride: usize,
    pub head_stride: usize,
}

impl Operand {
    /// Matrices of `len` elements packed one after another.
    pub fn packed(len: usize) -> Self {
        Operand {
            offset: 0,
            row_stride: 0,
            group_stride: len,
            head_stride: 0,
        }
    }

    /// Head h of item g of a token-major tensor `[groups, seq, row_stride]`
    /// whose row holds the heads' `head_dim` columns side by side from
    /// `col_offset` on (q, k or v inside a fused qkv; an attention output).
    pub fn heads_in_rows(layout: &HeadLayout) -> Self {
        Operand {
            offset: layout.col_offset,
            row_stride: layout.row_stride,
            group_stride: layout.seq * layout.row_stride,
            head_stride: layout.head_dim,
        }
    }

    /// Where batch item `item` starts.
    pub fn start(&self, item: usize, heads: usize) -> usize {
        self.offset + item / heads * self.group_stride + item % heads * self.head_stride
    }
}

impl Matmul {
    /// One product of an m x k and a k x n matrix.
    pub fn new(m: usize, n: usize, k: usize) -> Self {
        Self::batched(1, m, n, k)
    }

    /// `batch` independent products, matrices packed one after another.
    pub fn batched(batch: usize, m: usize, n: usize, k: usize) -> Self {
        Matmul {
            batch,
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            accumulate: false,
            alpha: 1.0,
            heads: 1,
            a: Operand::packed(m * k),
            b: Operand::packed(k * n),
            c: Operand::packed(m * n),
        }
    }

    /// `groups * heads` products whose operands are packed head-major
    /// (`[groups, heads, rows, cols]`) until one is given another layout.
    pub fn per_head(groups: usize, heads: usize, m: usize, n: usize, k: usize) -> Self {
        let packed = |len: usize| Operand {
            head_stride: len,
            ..Operand::packed(heads * len)
        };
        Matmul {
            heads,
            a: packed(m * k),
            b: packed(k * n),
            c: packed(m * n),
            ..Self::batched(groups * heads, m, n, k)
        }
    }

    pub fn trans_a(mut self) -> Self {
        self.trans_a = true;
        self
    }

    pub fn trans_b(mut self) -> Self {
        self.trans_b = true;
        self
    }

    pub fn accumulate(mut self) -> Self {
        self.accumulate = true;
        self
    }

    pub fn alpha(mut self, alpha: f32) -> Self {
        self.alpha = alpha;
        self
    }

    /// Every batch item uses the same B (a weight).
    pub fn shared_b(mut self) -> Self {
        self.b.group_stride = 0;
        self.b.head_stride = 0;
        self
    }

    pub fn with_a(mut self, a: Operand) -> Self {
        self.a = a;
        self
    }

    pub fn with_b(mut self, b: Operand) -> Self {
        self.b = b;
        self
    }

    pub fn with_c(mut self, c: Operand) -> Self {
        self.c = c;
        self
    }

    pub fn flops(&self) -> f64 {
        2.0 * (self.batch * self.m * self.n * self.k) as f64
    }

    /// (rows, columns) of A, B and C as stored.
    pub fn stored_dims(&self) -> [(usize, usize); 3] {
        let (m, n, k) = (self.m, self.n, self.k);
        [
            if self.trans_a { (k, m) } else { (m, k) },
            if self.trans_b { (n, k) } else { (k, n) },
            (m, n),
        ]
    }

    /// The row strides of A, B and C, packed rows resolved.
    pub fn row_strides(&self) -> [usize; 3] {
        let dims = self.stored_dims();
        let resolve = |op: &Operand, (_, cols): (usize, usize)| {
            if op.row_stride == 0 {
                cols
            } else {
                op.row_stride
            }
        };
        [
            resolve(&self.a, dims[0]),
            resolve(&self.b, dims[1]),
            resolve(&self.c, dims[2]),
        ]
    }

    /// Multiply-adds of the whole product, every batch item.
    pub fn multiply_adds(&self) -> usize {
        self.batch * self.m * self.n * self.k
    }

    /// Elements each operand must hold.
    pub fn required_lens(&self) -> (usize, usize, usize) {
        let dims = self.stored_dims();
        let strides = self.row_strides();
        let len = |i: usize, op: &Operand| {
            let (rows, cols) = dims[i];
            if self.batch == 0 || rows == 0 || cols == 0 {
                return 0;
            }
            // Strides are not negative, so the last item reaches furthest
            // once `batch` is a multiple of `heads`.
            op.start(self.batch - 1, self.heads) + (rows - 1) * strides[i] + cols
        };
        (len(0, &self.a), len(1, &self.b), len(2, &self.c))
    }

    /// Panics unless the shape is one both backends compute alike: batch
    /// items grouped by whole heads, operands long enough, and no two
    /// items of C sharing an element (they are computed in parallel).
    pub fn check(&self, lens: (usize, usize, usize)) {
        let need = self.required_lens();
        assert!(
            self.heads >= 1 && self.batch.is_multiple_of(self.heads),
            "matmul: batch {} is not a multiple of heads {}",
            self.batch,
            self.heads
        );
        assert!(
            lens.0 >= need.0 && lens.1 >= need.1 && lens.2 >= need.2,
            "matmul: operands of {lens:?} elements, {need:?} needed for {self:?}"
        );
        assert!(
            self.c_items_disjoint(),
            "matmul: batch items of C overlap in {self:?}"
        );
    }

    /// Panics unless the column sums of op(B) are those of B as stored
    /// (`[k, n]` from its start, rows packed), for one product, and `sums`
    /// holds one per column.
    pub fn check_column_sums(&self, sums_len: usize) {
        assert!(
            self.batch == 1
                && !self.trans_b
                && self.b.offset == 0
                && self.row_strides()[1] == self.n
                && sums_len >= self.n,
            "matmul_column_sums: one product, B packed and not transposed, one sum per column"
        );
    }

    /// Panics unless this is one product written to a packed C, and
    /// `pre_len` covers C (`matmul_gelu_backward`).
    pub fn check_gelu_backward(&self, pre_len: usize) {
        assert!(
            self.batch == 1
                && !self.accumulate
                && self.c.offset == 0
                && self.row_strides()[2] == self.n
                && pre_len >= self.m * self.n,
            "matmul_gelu_backward: one product written to a packed C, GELU's input as large as C"
        );
    }

    fn c_items_disjoint(&self) -> bool {
        let (m, n) = (self.m, self.n);
        if self.batch <= 1 || m == 0 || n == 0 {
            return true;
        }
        let ld = self.row_strides()[2];
        let c = &self.c;
        let extent = (m - 1) * ld + n;
        let heads_apart = self.heads == 1
            || c.head_stride >= extent
            || (c.head_stride >= n && (self.heads - 1) * c.head_stride + n <= ld);
        let groups = self.batch / self.heads;
        let group_extent = (self.heads - 1) * c.head_stride + extent;
        heads_apart && (groups == 1 || c.group_stride >= group_extent)
    }
}
