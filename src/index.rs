//! Index structures built on the host from token ids, which the host knows
//! when it assembles a batch. Building them there keeps the GPU kernels
//! deterministic without atomics. The device copies the ops take are
//! `backend::TokenIndex` and `backend::VocabSubsets`.

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

/// Token positions grouped by id, for the embedding backward:
/// `unique[u]`'s positions are `order[offsets[u]..offsets[u + 1]]`,
/// ascending, so every gradient row is summed in a fixed order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenGroups {
    pub unique: Vec<u32>,
    pub offsets: Vec<u32>,
    pub order: Vec<u32>,
}

/// Groups the positions of `ids` by id, after checking every id against
/// the vocabulary.
pub fn group_by_id(ids: &[u32], vocab: usize) -> Result<TokenGroups, IndexError> {
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
    Ok(TokenGroups {
        unique,
        offsets,
        order,
    })
}

/// The bitsets of `subsets` (`words` u32 per set, bit j = token j), after
/// checking their ids and that every row of `row_subset` names one of
/// them or [`FULL_VOCAB`]. Returns (bits, words).
pub fn subset_bits(
    vocab: usize,
    subsets: &[Vec<u32>],
    row_subset: &[u32],
) -> Result<(Vec<u32>, usize), IndexError> {
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
    Ok((bits, words))
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

    #[test]
    fn positions_are_grouped_by_id_in_order() {
        let g = group_by_id(&[4, 1, 4, 0, 1, 4], 5).unwrap();
        assert_eq!(g.unique, vec![0, 1, 4]);
        assert_eq!(g.offsets, vec![0, 1, 3, 6]);
        assert_eq!(g.order, vec![3, 1, 4, 0, 2, 5]);
    }

    #[test]
    fn out_of_range_tokens_and_subsets_are_named() {
        let err = group_by_id(&[1, 7], 5).unwrap_err();
        assert_eq!(
            err,
            IndexError::TokenOutOfRange {
                id: 7,
                position: 1,
                vocab: 5
            }
        );
        assert!(err.to_string().contains("token id 7 at position 1"));
        let err = subset_bits(5, &[vec![1]], &[0, 3]).unwrap_err();
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
        let row_subset = [0, FULL_VOCAB];
        let (bits, words) = subset_bits(40, &[vec![2, 33]], &row_subset).unwrap();
        let targets = [5, 6];
        let ok = |row, j| allowed(&row_subset, &bits, words, &targets, row, j);
        assert!(ok(0, 2) && ok(0, 33) && ok(0, 5));
        assert!(!ok(0, 6) && !ok(0, 32));
        assert!((0..40).all(|j| ok(1, j)));
    }
}
