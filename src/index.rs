//! Index structures built on the host from token ids, which the host knows
//! when it assembles a batch. Building them there keeps the GPU kernels
//! deterministic without atomics.

use crate::backend::Backend;

/// `row_subset` value meaning "the whole vocabulary".
pub const FULL_VOCAB: u32 = u32::MAX;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IndexError {
    #[error("token id {id} at position {position} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange {
        id: u32,
        position: usize,
        vocab: usize,
    },
    #[error("row {row} names vocabulary subset {subset}, but only {count} subsets were given")]
    NoSuchSubset {
        row: usize,
        subset: u32,
        count: usize,
    },
}

fn check_ids(ids: &[u32], vocab: usize) -> Result<(), IndexError> {
    match ids.iter().position(|&id| id as usize >= vocab) {
        Some(position) => Err(IndexError::TokenOutOfRange {
            id: ids[position],
            position,
            vocab,
        }),
        None => Ok(()),
    }
}

/// Token ids, and the same positions grouped by id for the embedding
/// backward: `unique[u]`'s positions are `order[offsets[u]..offsets[u + 1]]`,
/// ascending, so every gradient row is summed in a fixed order.
pub struct TokenIndex<B: Backend> {
    pub ids: B::Ids,
    pub unique: B::Ids,
    pub offsets: B::Ids,
    pub order: B::Ids,
    len: usize,
    unique_len: usize,
}

impl<B: Backend> TokenIndex<B> {
    pub fn new(backend: &B, ids: &[u32], vocab: usize) -> Result<Self, IndexError> {
        check_ids(ids, vocab)?;
        let mut order: Vec<u32> = (0..ids.len() as u32).collect();
        order.sort_by_key(|&i| ids[i as usize]); // stable: positions stay ascending per id
        let mut unique = Vec::new();
        let mut offsets = Vec::new();
        for (k, &pos) in order.iter().enumerate() {
            let id = ids[pos as usize];
            if unique.last() != Some(&id) {
                unique.push(id);
                offsets.push(k as u32);
            }
        }
        offsets.push(order.len() as u32);
        Ok(TokenIndex {
            ids: backend.ids(ids),
            unique: backend.ids(&unique),
            offsets: backend.ids(&offsets),
            order: backend.ids(&order),
            len: ids.len(),
            unique_len: unique.len(),
        })
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of distinct ids.
    pub fn unique_len(&self) -> usize {
        self.unique_len
    }
}

/// Which vocabulary each row of a logits matrix normalises over: row r uses
/// subset `row_subset[r]` (a bitset over the vocabulary), or the whole
/// vocabulary when it is [`FULL_VOCAB`]. The row's target always counts.
pub struct VocabSubsets<B: Backend> {
    pub row_subset: B::Ids,
    pub bits: B::Ids,
    /// u32 words per bitset.
    pub words: usize,
}

impl<B: Backend> VocabSubsets<B> {
    /// Every row over the whole vocabulary (plain cross-entropy).
    pub fn full(backend: &B, rows: usize) -> Self {
        VocabSubsets {
            row_subset: backend.ids(&vec![FULL_VOCAB; rows]),
            bits: backend.ids(&[0]),
            words: 1,
        }
    }

    /// `subsets[s]` lists the token ids of subset s; `row_subset[r]` picks a
    /// subset for row r, or is [`FULL_VOCAB`].
    pub fn new(
        backend: &B,
        vocab: usize,
        subsets: &[Vec<u32>],
        row_subset: &[u32],
    ) -> Result<Self, IndexError> {
        let words = vocab.div_ceil(32).max(1);
        let mut bits = vec![0u32; (subsets.len() * words).max(1)];
        for (s, ids) in subsets.iter().enumerate() {
            check_ids(ids, vocab)?;
            for &id in ids {
                bits[s * words + id as usize / 32] |= 1 << (id % 32);
            }
        }
        for (row, &subset) in row_subset.iter().enumerate() {
            if subset != FULL_VOCAB && subset as usize >= subsets.len() {
                return Err(IndexError::NoSuchSubset {
                    row,
                    subset,
                    count: subsets.len(),
                });
            }
        }
        Ok(VocabSubsets {
            row_subset: backend.ids(row_subset),
            bits: backend.ids(&bits),
            words,
        })
    }
}

/// Whether token j takes part in row r's softmax (the CPU twin of
/// `allowed` in `shaders/logprob.wgsl`).
pub fn allowed(
    row_subset: &[u32],
    bits: &[u32],
    words: usize,
    targets: &[u32],
    row: usize,
    j: usize,
) -> bool {
    let set = row_subset[row];
    if set == FULL_VOCAB || j == targets[row] as usize {
        return true;
    }
    (bits[set as usize * words + j / 32] >> (j % 32)) & 1 != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::CpuBackend;

    #[test]
    fn token_index_groups_positions_by_id_in_order() {
        let idx = TokenIndex::new(&CpuBackend, &[4, 1, 4, 0, 1, 4], 5).unwrap();
        assert_eq!(idx.unique, vec![0, 1, 4]);
        assert_eq!(idx.offsets, vec![0, 1, 3, 6]);
        assert_eq!(idx.order, vec![3, 1, 4, 0, 2, 5]);
        assert_eq!((idx.len(), idx.unique_len()), (6, 3));
    }

    #[test]
    fn out_of_range_tokens_and_subsets_are_named() {
        let err = TokenIndex::new(&CpuBackend, &[1, 7], 5).err().unwrap();
        assert_eq!(
            err,
            IndexError::TokenOutOfRange {
                id: 7,
                position: 1,
                vocab: 5
            }
        );
        assert!(err.to_string().contains("token id 7 at position 1"));
        let err = VocabSubsets::new(&CpuBackend, 5, &[vec![1]], &[0, 3])
            .err()
            .unwrap();
        assert_eq!(
            err,
            IndexError::NoSuchSubset {
                row: 1,
                subset: 3,
                count: 1
            }
        );
    }

    #[test]
    fn subsets_always_admit_the_target() {
        let s = VocabSubsets::new(&CpuBackend, 40, &[vec![2, 33]], &[0, FULL_VOCAB]).unwrap();
        let targets = [5, 6];
        let ok = |row, j| allowed(&s.row_subset, &s.bits, s.words, &targets, row, j);
        assert!(ok(0, 2) && ok(0, 33) && ok(0, 5));
        assert!(!ok(0, 6) && !ok(0, 32));
        assert!((0..40).all(|j| ok(1, j)));
    }
}
