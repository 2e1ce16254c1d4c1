//! Each image's nearest other images by image-embedding cosine: the hard
//! negatives DiscriTune can add to a caption's candidates (the DiscriTune
//! paper, appendix D.2). Computed once per set of embeddings and cached.

use crate::cache;
use crate::tensorfile;
use rayon::prelude::*;

/// `table[i * k..(i + 1) * k]`: image i's k nearest other images, nearest
/// first (ties to the lower index).
#[derive(Clone, Debug, PartialEq)]
pub struct Neighbours {
    pub k: usize,
    table: Vec<u32>,
}

impl Neighbours {
    /// From unit `[n, dim]` embeddings; `k` is capped at n - 1.
    pub fn compute(embeddings: &[f32], dim: usize, k: usize) -> Neighbours {
        let n = embeddings.len() / dim.max(1);
        let k = k.min(n.saturating_sub(1));
        let row = |i: usize| &embeddings[i * dim..(i + 1) * dim];
        let table = (0..n)
            .into_par_iter()
            .flat_map_iter(|i| nearest(embeddings, dim, row(i), Some(i), k))
            .map(|j| j as u32)
            .collect();
        Neighbours { k, table }
    }

    /// As `compute`, read from the cache when the same embeddings were
    /// seen before (keyed by `data_name`, k and the embeddings' bytes).
    pub fn cached(data_name: &str, embeddings: &[f32], dim: usize, k: usize) -> Neighbours {
        let n = embeddings.len() / dim.max(1);
        let k = k.min(n.saturating_sub(1));
        let key = format!(
            "k{k}-{}",
            tensorfile::fingerprint(bytemuck::cast_slice(embeddings))
        );
        let path = cache::neighbours(data_name, &key);
        if let Ok(bytes) = std::fs::read(&path)
            && bytes.len() == n * k * 4
        {
            let table: Vec<u32> = bytes
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .filter(|&j| (j as usize) < n)
                .collect();
            if table.len() == n * k {
                return Neighbours { k, table };
            }
        }
        let computed = Neighbours::compute(embeddings, dim, k);
        let bytes: Vec<u8> = computed
            .table
            .iter()
            .flat_map(|j| j.to_le_bytes())
            .collect();
        if let Err(e) = tensorfile::write_atomic(&path, &bytes) {
            eprintln!(
                "warning: could not cache the image neighbours at {}: {e:#}; they are computed \
                 again next time",
                path.display()
            );
        }
        computed
    }

    /// Image i's neighbours, nearest first.
    pub fn of(&self, i: usize) -> &[u32] {
        &self.table[i * self.k..(i + 1) * self.k]
    }
}

/// The `k` rows of unit `[n, dim]` `embeddings` nearest `query` by
/// cosine, nearest first (ties to the lower index), row `except` left out.
pub fn nearest(
    embeddings: &[f32],
    dim: usize,
    query: &[f32],
    except: Option<usize>,
    k: usize,
) -> Vec<usize> {
    let n = embeddings.len() / dim.max(1);
    let mut scored: Vec<(f32, usize)> = (0..n)
        .filter(|&j| Some(j) != except)
        .map(|j| {
            let row = &embeddings[j * dim..(j + 1) * dim];
            (query.iter().zip(row).map(|(a, b)| a * b).sum(), j)
        })
        .collect();
    let order = |a: &(f32, usize), b: &(f32, usize)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    if k < scored.len() {
        scored.select_nth_unstable_by(k, order);
        scored.truncate(k);
    }
    scored.sort_by(order);
    scored.into_iter().map(|(_, j)| j).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_by_cosine_without_itself() {
        // Four unit vectors in the plane at 0, 10, 90 and 180 degrees.
        let at = |deg: f32| [deg.to_radians().cos(), deg.to_radians().sin()];
        let e: Vec<f32> = [0.0, 10.0, 90.0, 180.0].into_iter().flat_map(at).collect();
        let n = Neighbours::compute(&e, 2, 2);
        assert_eq!(n.of(0), &[1, 2]);
        assert_eq!(n.of(1), &[0, 2]);
        assert_eq!(n.of(2), &[1, 0]);
        assert_eq!(n.of(3), &[2, 1]);
        // k past the other images is capped.
        assert_eq!(Neighbours::compute(&e, 2, 10).k, 3);
    }
}
