//! Index structures on the device: token ids grouped by id, and the
//! vocabulary subsets a row of logits normalises over (built on the host
//! by `crate::index`).

use super::Backend;
use crate::index::{FULL_VOCAB, IndexError, group_by_id, subset_bits};

/// Token ids on the device, and the same positions grouped by id for the
/// embedding backward (`index::group_by_id`).
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
        let groups = group_by_id(ids, vocab)?;
        Ok(TokenIndex {
            ids: backend.ids(ids),
            unique: backend.ids(&groups.unique),
            offsets: backend.ids(&groups.offsets),
            order: backend.ids(&groups.order),
            len: ids.len(),
            unique_len: groups.unique.len(),
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
        let (bits, words) = subset_bits(vocab, subsets, row_subset)?;
        Ok(VocabSubsets {
            row_subset: backend.ids(row_subset),
            bits: backend.ids(&bits),
            words,
        })
    }
}
