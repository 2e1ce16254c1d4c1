//! Which matmul kernel a product takes, and whether it runs split-K.
//!
//! A GPU has 24 to 132 compute units, each taking a workgroup or two at
//! once; a product of fewer workgroups leaves most of them idle. So the
//! tiles shrink with the product: the adapter's large tile when it gives
//! enough workgroups, else smaller ones, and a long k is shared among
//! workgroups (split-K) where tiles alone cannot. The plan depends on the
//! shape and the adapter's kernel family alone, so a product's bits do not
//! depend on scheduling.

/// Threads a matmul dispatch should have at least: 64 workgroups of
/// 256. On an NVIDIA H200, 96 workgroups of the 32-thread kernel left an
/// SCST baseline's 16-row products latency-bound (16 x 768 x 768 and
/// 16 x 768 x 3072 took 1.17 ms on average); the kernels of fewer
/// threads need more workgroups.
const MIN_THREADS: usize = 64 * 256;
/// Workgroups enough for the 128 x 128 kernel: on an NVIDIA H200 (the one
/// real GPU measured kernel by kernel) it ran a 64-row product split into
/// 54 workgroups 3.7 times as fast as the 64 x 64 kernel in 72, and every
/// larger product of a GPT-2-small step 2.5 to 7 times as fast.
const SHARED_MIN_WORKGROUPS: usize = 32;
/// Rows from which a product takes the 128 x 128 kernel.
const SHARED_MIN_ROWS: usize = 16;
/// The shortest k a split takes.
const SPLIT_MIN_K: usize = 128;
const MAX_SPLITS: usize = 16;
/// Rows up to which a product takes the one-row kernel.
const ROW_KERNEL_MAX_M: usize = 4;

/// The matmul kernels of `shaders/matmul.wgsl`, by the tile of C one
/// workgroup computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatmulTile {
    /// 128 x 128 through workgroup memory (`matmul_shared`): real GPUs.
    Shared128,
    /// The same through two staging buffers, one barrier per k-slice
    /// (`matmul_shared_buffered`): a candidate for real GPUs, chosen by
    /// `CAPTUNE_MATMUL_TILES=buffered` until one has measured it.
    Shared128Buffered,
    /// 64 x 64 in registers (`matmul_registers`): software adapters, and
    /// real GPUs' products of too few 128 x 128 tiles.
    Registers64,
    /// 16 x 8, four rows per thread (`matmul_skinny`): products too small
    /// for either, such as the mapper's, whose rows are a batch's images.
    Skinny16x8,
    /// 1 x 64, one output per thread (`matmul_row`): products of one to
    /// four rows, which a taller tile would mostly pad.
    Row1x64,
}

impl MatmulTile {
    pub const ALL: [MatmulTile; 5] = [
        MatmulTile::Shared128,
        MatmulTile::Shared128Buffered,
        MatmulTile::Registers64,
        MatmulTile::Skinny16x8,
        MatmulTile::Row1x64,
    ];

    pub fn entry(self) -> &'static str {
        match self {
            MatmulTile::Shared128 => "matmul_shared",
            MatmulTile::Shared128Buffered => "matmul_shared_buffered",
            MatmulTile::Registers64 => "matmul_registers",
            MatmulTile::Skinny16x8 => "matmul_skinny",
            MatmulTile::Row1x64 => "matmul_row",
        }
    }

    /// Rows and columns of C per workgroup.
    pub fn size(self) -> (usize, usize) {
        match self {
            MatmulTile::Shared128 | MatmulTile::Shared128Buffered => (128, 128),
            MatmulTile::Registers64 => (64, 64),
            MatmulTile::Skinny16x8 => (16, 8),
            MatmulTile::Row1x64 => (1, 64),
        }
    }

    /// Output tiles of an m x n product.
    pub fn tiles(self, m: usize, n: usize) -> usize {
        let (rows, cols) = self.size();
        m.div_ceil(rows) * n.div_ceil(cols)
    }

    /// The 128 x 128 kernels, which outrun the others on fewer
    /// workgroups and with most of their rows padding.
    pub fn is_128(self) -> bool {
        matches!(self, MatmulTile::Shared128 | MatmulTile::Shared128Buffered)
    }

    /// Threads per workgroup: the entry point's `@workgroup_size` in
    /// shaders/matmul.wgsl.
    pub fn threads(self) -> usize {
        match self {
            MatmulTile::Shared128 | MatmulTile::Shared128Buffered | MatmulTile::Registers64 => 256,
            MatmulTile::Skinny16x8 => 32,
            MatmulTile::Row1x64 => 64,
        }
    }

    /// The workgroups a dispatch of this kernel should have: split-K
    /// aims at them.
    pub fn wanted_workgroups(self) -> usize {
        MIN_THREADS / self.threads()
    }

    /// The workgroups with which a plan takes this kernel: those it wants,
    /// or fewer for the 128 x 128 kernels.
    fn enough_workgroups(self) -> usize {
        if self.is_128() {
            SHARED_MIN_WORKGROUPS
        } else {
            self.wanted_workgroups()
        }
    }
}

/// Which kernels a backend chooses among.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulKernel {
    /// Register tiles for large products: software adapters (lavapipe),
    /// where workgroup barriers are expensive.
    Registers,
    /// Workgroup-memory tiles for large products: real GPUs.
    Shared,
    /// The same with the double-buffered 128 x 128 kernel.
    SharedBuffered,
    /// One kernel for every product (the kernels' tests).
    Only(MatmulTile),
}

/// How one product runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulPlan {
    pub tile: MatmulTile,
    /// The k of each split, or `None` for the whole k in one workgroup.
    pub k_split: Option<usize>,
}

impl MatmulPlan {
    /// The dispatch's grid for a batch of `batch` products: C's column
    /// tiles, its row tiles, and the batch items or the splits.
    pub fn grid(&self, m: usize, n: usize, k: usize, batch: usize) -> [usize; 3] {
        let (rows, cols) = self.tile.size();
        let layers = self.k_split.map_or(batch, |per| k.div_ceil(per));
        [n.div_ceil(cols), m.div_ceil(rows), layers]
    }

    /// Workgroups of that dispatch.
    pub fn workgroups(&self, m: usize, n: usize, k: usize, batch: usize) -> usize {
        self.grid(m, n, k, batch).iter().product()
    }
}

/// The k of each split when an m x n product of depth `k` runs split-K
/// on `tile`, or `None` when it runs whole: it has the workgroups already,
/// or too short a k to share.
pub fn k_split(tile: MatmulTile, m: usize, n: usize, k: usize) -> Option<usize> {
    let (tiles, wanted) = (tile.tiles(m, n), tile.wanted_workgroups());
    if tiles >= wanted {
        return None;
    }
    let splits = wanted
        .div_ceil(tiles.max(1))
        .min(k / SPLIT_MIN_K)
        .min(MAX_SPLITS);
    (splits >= 2).then(|| k.div_ceil(splits).next_multiple_of(8))
}

/// The plan for `batch` products of m x n over k; `splittable` when the
/// product may run split-K (one product into a packed C). Tiles are tried
/// from the largest down, each split where `k_split` says: the first that
/// gives its kernel enough workgroups is taken; else the smallest, split
/// if k allows.
pub fn plan(
    kernel: MatmulKernel,
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    splittable: bool,
) -> MatmulPlan {
    let planned = |tile: MatmulTile| MatmulPlan {
        tile,
        k_split: splittable.then(|| k_split(tile, m, n, k)).flatten(),
    };
    let family: &[MatmulTile] = match kernel {
        MatmulKernel::Only(tile) => return planned(tile),
        _ if m <= ROW_KERNEL_MAX_M => &[MatmulTile::Row1x64],
        MatmulKernel::Shared => &[
            MatmulTile::Shared128,
            MatmulTile::Registers64,
            MatmulTile::Skinny16x8,
        ],
        MatmulKernel::SharedBuffered => &[
            MatmulTile::Shared128Buffered,
            MatmulTile::Registers64,
            MatmulTile::Skinny16x8,
        ],
        MatmulKernel::Registers => &[MatmulTile::Registers64, MatmulTile::Skinny16x8],
    };
    let smallest = family[family.len() - 1];
    // A tile wider or taller than the product computes mostly padding;
    // the 128 x 128 one still outruns the others with seven eighths of its
    // rows padding: on an NVIDIA H200, 1.2 to 2.4 times the 16 x 8 kernel
    // on an SCST baseline's 16-row products, split either way.
    let fits = |tile: MatmulTile| {
        let (rows, cols) = tile.size();
        let rows_used = if tile.is_128() { SHARED_MIN_ROWS } else { rows };
        rows_used <= m && cols <= n
    };
    family
        .iter()
        .copied()
        .filter(|&tile| fits(tile) && tile != smallest)
        .map(planned)
        .find(|p| p.workgroups(m, n, k, batch) >= p.tile.enough_workgroups())
        .unwrap_or_else(|| planned(smallest))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A product's plan's workgroups over the workgroups its kernel needs.
    fn share_of_enough(
        kernel: MatmulKernel,
        (m, n, k, batch): (usize, usize, usize, usize),
    ) -> f64 {
        let p = plan(kernel, m, n, k, batch, batch == 1);
        p.workgroups(m, n, k, batch) as f64 / p.tile.enough_workgroups() as f64
    }

    /// The products of a GPT-2-small ClipCap step (batch 16, 41 positions,
    /// width 768, 12 heads, mapper 512 -> 768 -> 7680) each get the
    /// workgroups their kernel needs on either kernel family, or as many
    /// splits as their k allows.
    #[test]
    fn gpt2_small_products_fill_a_gpu() {
        let rows = 16 * 41;
        let shapes = [
            (16, 768, 512, 1),     // mapper's first layer
            (16, 7680, 768, 1),    // its second
            (16, 768, 7680, 1),    // the gradient into its hidden layer
            (512, 768, 16, 1),     // its first layer's weight gradient
            (rows, 2304, 768, 1),  // q, k, v
            (41, 41, 64, 16 * 12), // scores per head
            (41, 64, 41, 16 * 12), // weights times values
            (768, 768, rows, 1),   // a weight gradient
            (768, 3072, rows, 1),  // the MLP's
            (rows, 768, 3072, 1),  // the MLP's second layer
        ];
        for kernel in [MatmulKernel::Registers, MatmulKernel::Shared] {
            for shape in shapes {
                let got = share_of_enough(kernel, shape);
                let (m, n, k, batch) = shape;
                let splits = plan(kernel, m, n, k, batch, batch == 1)
                    .k_split
                    .map(|per| k.div_ceil(per));
                let most = (k / SPLIT_MIN_K).min(MAX_SPLITS);
                assert!(
                    got >= 1.0 || splits == Some(most),
                    "{kernel:?} {shape:?}: {got} of the workgroups wanted, {splits:?} splits"
                );
            }
        }
    }

    #[test]
    fn large_tiles_are_kept_where_they_fill_the_device() {
        let p = plan(MatmulKernel::Shared, 1024, 1024, 1024, 1, true);
        assert_eq!(
            p,
            MatmulPlan {
                tile: MatmulTile::Shared128,
                k_split: None
            }
        );
        // A weight gradient of few large tiles splits its k before its
        // tiles shrink.
        let p = plan(MatmulKernel::Shared, 768, 768, 656, 1, true);
        assert_eq!(p.tile, MatmulTile::Shared128);
        assert_eq!(p.k_split, Some(328));
        // Where it may not split (a strided C), its 36 tiles whole are
        // enough for the 128 x 128 kernel, but not for the 64 x 64 one.
        let p = plan(MatmulKernel::Shared, 768, 768, 656, 1, false);
        assert_eq!(
            p,
            MatmulPlan {
                tile: MatmulTile::Shared128,
                k_split: None
            }
        );
        let p = plan(MatmulKernel::Registers, 256, 768, 656, 1, false);
        assert_eq!(p.tile, MatmulTile::Skinny16x8);
        // A tall product of few columns takes tiles of its width.
        let p = plan(MatmulKernel::Shared, 8192, 8, 64, 1, false);
        assert_eq!(p.tile, MatmulTile::Skinny16x8);
        // The buffered family plans as the shared one, with its own
        // 128 x 128 kernel.
        for (m, n, k) in [
            (1024, 1024, 1024),
            (64, 2304, 768),
            (16, 768, 3072),
            (8, 768, 768),
        ] {
            let shared = plan(MatmulKernel::Shared, m, n, k, 1, true);
            let buffered = plan(MatmulKernel::SharedBuffered, m, n, k, 1, true);
            let tile = match shared.tile {
                MatmulTile::Shared128 => MatmulTile::Shared128Buffered,
                other => other,
            };
            assert_eq!(buffered, MatmulPlan { tile, ..shared }, "{m} x {n} x {k}");
        }
    }

    /// Decoding's 64 rows, and an SCST baseline's 16: the 128 x 128 tiles
    /// where they make 32 workgroups, split or whole, else the smaller
    /// kernels as before.
    #[test]
    fn decoding_products_take_the_large_tiles_with_most_of_their_rows_padding() {
        let shared = |m, n, k| plan(MatmulKernel::Shared, m, n, k, 1, true);
        // qkv: 18 tiles, split four ways.
        assert_eq!(
            shared(64, 2304, 768),
            MatmulPlan {
                tile: MatmulTile::Shared128,
                k_split: Some(192)
            }
        );
        // The output layer: 393 tiles.
        assert_eq!(
            shared(64, 50257, 768),
            MatmulPlan {
                tile: MatmulTile::Shared128,
                k_split: None
            }
        );
        // The projection: 6 tiles, split six ways (k / 128).
        assert_eq!(
            shared(64, 768, 768),
            MatmulPlan {
                tile: MatmulTile::Shared128,
                k_split: Some(128)
            }
        );
        // A baseline's fc2: 6 tiles, split eleven ways.
        assert_eq!(
            shared(16, 768, 3072),
            MatmulPlan {
                tile: MatmulTile::Shared128,
                k_split: Some(280)
            }
        );
        // Fewer rows than an eighth of the tile: never the 128 x 128 kernel.
        assert_eq!(shared(15, 50257, 768).tile, MatmulTile::Skinny16x8);
    }

    #[test]
    fn one_row_products_take_the_row_kernel_and_tiny_ones_split_small_tiles() {
        for kernel in [MatmulKernel::Registers, MatmulKernel::Shared] {
            let p = plan(kernel, 1, 40, 64, 64 * 12, false);
            assert_eq!(
                p,
                MatmulPlan {
                    tile: MatmulTile::Row1x64,
                    k_split: None
                }
            );
            // The shapes preset's weight gradient: 64 x 64 over 768, its
            // 32 tiles split six ways (k / 128).
            let p = plan(kernel, 64, 64, 768, 1, true);
            assert_eq!(p.tile, MatmulTile::Skinny16x8, "{kernel:?}");
            assert_eq!(p.workgroups(64, 64, 768, 1), 192, "{kernel:?}");
        }
        // A forced kernel is taken as it is, split as far as k allows
        // (2001 / 128).
        let only = MatmulKernel::Only(MatmulTile::Registers64);
        let p = plan(only, 40, 70, 2001, 1, true);
        assert_eq!(p.tile, MatmulTile::Registers64);
        assert_eq!(p.k_split.map(|per| 2001usize.div_ceil(per)), Some(15));
    }
}
