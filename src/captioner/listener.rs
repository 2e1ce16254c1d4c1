//! The frozen retriever reading the captioner's captions (the "listener"
//! of the retriever-in-the-loop objectives): the two models' vocabularies
//! differ, so a caption's ids go through a map built once, then through
//! the retriever's text tower. [`RelaxedListener`] also reads captions
//! relaxed by the Gumbel-softmax and carries the gradient of its embedding
//! back to the captioner's logits.

use super::{CaptionVocab, SpecialIds};
use crate::backend::{Backend, Matmul, NO_ROW, SoftmaxRows};
use crate::model::retriever::RetrieverConfig;
use crate::model::retriever::{Retriever, TextBatch};
use crate::retriever::eval::embed_ids;
use crate::retriever::frozen::{CaptionReader, Framing, FrozenRetriever};
use anyhow::{Result, bail};

/// Captioner id -> the retriever's pieces of the word it spells
/// (`CaptionVocab::spelled`): for captune's retriever one id, `<unk>` for
/// a word it does not know; for a CLIP the word's BPE pieces, one or
/// more. An alternative (SMILE's reserved copy of a word) maps as its
/// word; a captioner's own BPE piece as the word its text is, without the
/// space that begins a word. The caption's end maps to the retriever's
/// end. The relaxed listener needs this map, id by id, to carry a
/// gradient back to each id; a chosen caption is read whole by
/// [`read_caption`] instead, so that a word the captioner splits into
/// several pieces reaches the retriever as one word.
#[derive(Clone, Debug, PartialEq)]
pub struct VocabMap {
    pieces: Vec<Vec<u32>>,
    /// The captioner's.
    specials: SpecialIds,
    /// The retriever's begin, end and empty caption.
    framing: Framing,
}

impl VocabMap {
    pub fn new(captioner: &CaptionVocab, retriever: &CaptionReader) -> Result<VocabMap> {
        let specials = captioner.specials();
        let pieces = (0..captioner.len() as u32)
            .map(|id| match id {
                _ if id == specials.end => Ok(vec![retriever.end()]),
                _ if specials.is_masked(id) => Ok(retriever.special(&captioner.spelled(id))),
                _ => retriever.pieces(&captioner.spelled(id)),
            })
            .collect::<Result<_>>()?;
        Ok(VocabMap {
            pieces,
            specials,
            framing: retriever.framing(),
        })
    }

    /// The retriever's pieces of captioner id `id` (an id past the
    /// vocabulary reads as an empty caption does).
    pub fn pieces(&self, id: u32) -> &[u32] {
        self.pieces.get(id as usize).unwrap_or(&self.framing.empty)
    }

    /// The most pieces a captioner id maps to.
    fn longest(&self) -> usize {
        self.pieces.iter().map(Vec::len).max().unwrap_or(0)
    }
}

/// A generated caption (ids up to its end, if any; specials dropped) as
/// the retriever reads its words: begin, the words' pieces, end, within
/// `max_len` (`CaptionReader::encode` of the words rewards read,
/// `CaptionVocab::decode_words`). An empty caption reads as the retriever
/// reads one.
pub fn read_caption(
    vocab: &CaptionVocab,
    reader: &CaptionReader,
    generated: &[u32],
    max_len: usize,
) -> Result<Vec<u32>> {
    let specials = vocab.specials();
    let kept: Vec<u32> = generated
        .iter()
        .take_while(|&&id| id != specials.end)
        .filter(|&&id| !specials.is_masked(id))
        .copied()
        .collect();
    reader.encode(&vocab.decode_words(&kept), max_len)
}

/// The unit text embeddings `[n, embed_dim]` of generated captions in
/// `vocab`, read by `retriever`'s text tower through `reader`.
pub fn embed_generated<B: Backend>(
    b: &B,
    retriever: &mut Retriever<B>,
    reader: &CaptionReader,
    vocab: &CaptionVocab,
    captions: &[&[u32]],
) -> Result<Vec<f32>> {
    let max_len = retriever.config.max_len;
    let ids = (captions.iter())
        .map(|c| read_caption(vocab, reader, c, max_len))
        .collect::<Result<Vec<_>>>()?;
    embed_ids(b, retriever, &ids)
}

/// The run's retriever (`StepContext::retriever`), checked to embed in
/// the features' `dim`, for `objective`.
pub fn frozen_retriever<'r, B: Backend>(
    retriever: Option<&'r mut FrozenRetriever<B>>,
    dim: usize,
    objective: &str,
) -> Result<&'r mut FrozenRetriever<B>> {
    let Some(retriever) = retriever else {
        bail!(
            "{objective} needs the frozen retriever: pass --retriever PATH (a captune retriever, \
             or clip:FOLDER for a Hugging Face CLIP), the encoder whose image embeddings are the \
             run's features"
        );
    };
    if retriever.model.config.embed_dim != dim {
        bail!(
            "{objective}: the retriever embeds in {} dimensions but the run's features have {dim}; \
             the features must be this retriever's image embeddings (captune embed --checkpoint \
             RETRIEVER, or --clip FOLDER for a CLIP)",
            retriever.model.config.embed_dim
        );
    }
    Ok(retriever)
}

/// How a relaxed caption reaches the text tower.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relaxation {
    /// The chosen tokens' embeddings forward, the softmax's gradient
    /// backward (straight-through).
    StraightThrough,
    /// The softmax's mixture of token embeddings both ways.
    Soft,
}

/// The frozen retriever reading captions sampled by the Gumbel-max trick
/// (`Decoding::Gumbel`), relaxed: at each step of caption n, y =
/// softmax((z + g) / tau) over the teacher-forced logits z with the noise
/// g the choice was made with; the text tower's input at that position is
/// y times the retriever's token embeddings (mapped to the captioner's
/// vocabulary), or, straight-through, the chosen token's embedding
/// forward with y's gradient backward. It reads the run's frozen
/// retriever in place (each call is given it); the retriever is never
/// trained.
///
/// A chosen word the retriever reads as several pieces (a CLIP's BPE)
/// takes as many of the tower's positions. The j-th of them is relaxed
/// over every word's j-th piece (a word with fewer pieces contributes
/// nothing there): forward it holds the chosen word's j-th piece, and its
/// gradient reaches y through every word's j-th piece. Pieces after the
/// [`RELAXED_PIECES`]-th are read as chosen, without a gradient.
pub struct RelaxedListener<B: Backend> {
    /// Per piece slot j, `[captioner vocab, text width]`: the retriever's
    /// embedding of each captioner id's j-th piece, zero where it has none
    /// (the frozen table, gathered once).
    slot_tables: Vec<B::Tensor>,
    map: VocabMap,
    /// The buffers of each shape seen, kept: steps of one shape allocate
    /// no tensor.
    buffers: Vec<Buffers<B>>,
    step: Option<RelaxedStep<B>>,
}

/// The pieces of a word that carry a gradient to the captioner.
pub const RELAXED_PIECES: usize = 4;

/// A forward's and its backward's device tensors for `captions` captions
/// of `positions` captioner steps each.
struct Buffers<B: Backend> {
    captions: usize,
    positions: usize,
    /// (z + g) / tau, then y, `[rows, vocab]`.
    perturbed: B::Tensor,
    relaxed: B::Tensor,
    /// Soft: y's mixture of one slot's embeddings, the chosen ones', their
    /// difference `[rows, width]`, moved to the tower's rows for every slot.
    soft: B::Tensor,
    hard: B::Tensor,
    difference: B::Tensor,
    shift: B::Tensor,
    d_rows: B::Tensor,
    d_relaxed: B::Tensor,
    d_logits: B::Tensor,
}

impl<B: Backend> Buffers<B> {
    fn new(
        b: &B,
        captions: usize,
        positions: usize,
        vocab: usize,
        config: &RetrieverConfig,
    ) -> Self {
        let (rows, width) = (captions * positions, config.text.width);
        let tower_rows = captions * config.max_len;
        Buffers {
            captions,
            positions,
            perturbed: b.zeros(rows * vocab),
            relaxed: b.zeros(rows * vocab),
            soft: b.zeros(rows * width),
            hard: b.zeros(rows * width),
            difference: b.zeros(rows * width),
            shift: b.zeros(tower_rows * width),
            d_rows: b.zeros(rows * width),
            d_relaxed: b.zeros(rows * vocab),
            d_logits: b.zeros(rows * vocab),
        }
    }
}

/// What a forward keeps for its backward.
struct RelaxedStep<B: Backend> {
    texts: TextBatch<B>,
    /// Per slot, captioner row (n * positions + t) -> the text tower's row
    /// of that token's piece, or NO_ROW.
    tower_rows: Vec<B::Ids>,
    /// Its buffers (y among them), by index.
    buffers: usize,
    tau: f32,
}

/// Where a batch of relaxed captions sits in the text tower, per slot.
struct Layout {
    sequences: Vec<Vec<u32>>,
    /// Per slot: tower row -> captioner row, or NO_ROW.
    sources: Vec<Vec<u32>>,
    /// Per slot: captioner row -> tower row, or NO_ROW.
    tower_rows: Vec<Vec<u32>>,
    /// Each captioner row's chosen id (padding where there is none).
    chosen: Vec<u32>,
}

impl VocabMap {
    /// `captions` (the chosen ids after `<bos>`) as the tower reads them
    /// (`VocabMap::caption`, the end included), with `slots` relaxed slots.
    fn layout(
        &self,
        captions: &[Vec<u32>],
        positions: usize,
        max_len: usize,
        slots: usize,
    ) -> Layout {
        let (n, rows) = (captions.len(), captions.len() * positions);
        let mut l = Layout {
            sequences: Vec::with_capacity(n),
            sources: vec![vec![NO_ROW; n * max_len]; slots],
            tower_rows: vec![vec![NO_ROW; rows]; slots],
            chosen: vec![self.specials.pad; rows],
        };
        for (c, caption) in captions.iter().enumerate() {
            let mut ids = vec![self.framing.begin];
            if caption.first().is_none_or(|&id| id == self.specials.end) {
                // An empty caption reads as the retriever reads one.
                ids.extend(&self.framing.empty);
            }
            for (t, &token) in caption.iter().take(positions).enumerate() {
                let row = c * positions + t;
                l.chosen[row] = token;
                for (j, &piece) in self.pieces(token).iter().enumerate() {
                    if ids.len() == max_len {
                        break;
                    }
                    if j < slots {
                        l.sources[j][c * max_len + ids.len()] = row as u32;
                        l.tower_rows[j][row] = (c * max_len + ids.len()) as u32;
                    }
                    ids.push(piece);
                }
            }
            if ids.last() != Some(&self.framing.end) {
                // Cut short: the tower still reads an end, with no gradient.
                if ids.len() == max_len {
                    let last = c * max_len + max_len - 1;
                    for j in 0..slots {
                        let row = l.sources[j][last];
                        if row != NO_ROW {
                            l.tower_rows[j][row as usize] = NO_ROW;
                            l.sources[j][last] = NO_ROW;
                        }
                    }
                    ids[max_len - 1] = self.framing.end;
                } else {
                    ids.push(self.framing.end);
                }
            }
            l.sequences.push(ids);
        }
        l
    }
}

impl<B: Backend> RelaxedListener<B> {
    /// A listener of `retriever` (frozen) for captions in the captioner's
    /// vocabulary, mapped by `map`.
    pub fn new(b: &B, retriever: &Retriever<B>, map: VocabMap) -> Self {
        let width = retriever.config.text.width;
        let vocab = map.pieces.len();
        let slot_tables = (0..map.longest().min(RELAXED_PIECES))
            .map(|j| {
                let ids: Vec<u32> = (map.pieces.iter())
                    .map(|p| p.get(j).copied().unwrap_or(NO_ROW))
                    .collect();
                let mut table = b.zeros(vocab * width);
                b.embedding(
                    retriever.token_table(),
                    &b.ids(&ids),
                    &mut table,
                    width,
                    false,
                );
                table
            })
            .collect();
        RelaxedListener {
            slot_tables,
            map,
            buffers: Vec::new(),
            step: None,
        }
    }

    /// The text embeddings `[captions, embed_dim]` (not normalised) of
    /// `captions` (the chosen ids after `<bos>`, as `Decoding::Gumbel`
    /// chose them with `seed`), relaxed with `logits`, the model's
    /// teacher-forced logits over `positions` steps per caption.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &mut self,
        b: &B,
        retriever: &mut Retriever<B>,
        logits: &B::Tensor,
        captions: &[Vec<u32>],
        positions: usize,
        seed: u64,
        tau: f32,
        relaxation: Relaxation,
    ) -> Result<Vec<f32>> {
        let n = captions.len();
        let config = retriever.config;
        let (max_len, width) = (config.max_len, config.text.width);
        let vocab = self.map.pieces.len();
        let rows = n * positions;
        let slots = self.slot_tables.len();
        let layout = self.map.layout(captions, positions, max_len, slots);
        let texts = TextBatch::new(b, &config, &layout.sequences)?;
        let shape = (n, positions);
        let at = match (self.buffers.iter()).position(|w| (w.captions, w.positions) == shape) {
            Some(at) => at,
            None => {
                (self.buffers).push(Buffers::new(b, n, positions, vocab, &config));
                self.buffers.len() - 1
            }
        };
        let w = &mut self.buffers[at];
        b.gumbel_logits(logits, vocab, positions, seed, 0, tau, &mut w.perturbed);
        b.softmax(
            &w.perturbed,
            &mut w.relaxed,
            &SoftmaxRows::plain(rows, vocab),
            None,
        );
        let shift = match relaxation {
            Relaxation::StraightThrough => None,
            Relaxation::Soft => {
                // Per slot, soft minus chosen embeddings, moved to the
                // tower's rows (each slot's rows its own).
                let chosen = b.ids(&layout.chosen);
                for (j, table) in self.slot_tables.iter().enumerate() {
                    b.matmul(
                        &w.relaxed,
                        table,
                        &mut w.soft,
                        &Matmul::new(rows, width, vocab),
                    );
                    b.embedding(table, &chosen, &mut w.hard, width, false);
                    b.add(1.0, &w.soft, -1.0, &w.hard, &mut w.difference);
                    let source = b.ids(&layout.sources[j]);
                    b.embedding(&w.difference, &source, &mut w.shift, width, j > 0);
                }
                Some(&w.shift)
            }
        };
        retriever.encode_text_inputs(b, &texts, shift)?;
        let embeddings = b.to_vec(retriever.text_embeddings());
        self.step = Some(RelaxedStep {
            texts,
            tower_rows: layout.tower_rows.iter().map(|r| b.ids(r)).collect(),
            buffers: at,
            tau,
        });
        Ok(embeddings)
    }

    /// The gradient of the last forward's logits (`[captions * positions,
    /// vocab]`) given `d_embeddings` (`[captions, embed_dim]`) on its
    /// embeddings.
    pub fn backward(
        &mut self,
        b: &B,
        retriever: &mut Retriever<B>,
        d_embeddings: &[f32],
    ) -> &B::Tensor {
        let s = self.step.as_ref().expect("a forward before its backward");
        let width = retriever.config.text.width;
        let vocab = self.map.pieces.len();
        let d_input = retriever.text_input_gradient(b, &s.texts, d_embeddings);
        let w = &mut self.buffers[s.buffers];
        for (j, table) in self.slot_tables.iter().enumerate() {
            b.embedding(d_input, &s.tower_rows[j], &mut w.d_rows, width, false);
            let mut shape = Matmul::new(w.captions * w.positions, vocab, width);
            shape.trans_b = true;
            shape.alpha = 1.0 / s.tau;
            shape.accumulate = j > 0;
            b.matmul(&w.d_rows, table, &mut w.d_relaxed, &shape);
        }
        b.softmax_backward(&w.relaxed, &w.d_relaxed, &mut w.d_logits, vocab, false);
        &w.d_logits
    }
}

/// CLIP relevance's loss -mean_n cos(image_n, text_n) of unit `images`
/// and raw `texts` (`[n, dim]` each): (loss, each cosine, d loss / d texts).
pub fn negative_cosine(images: &[f32], texts: &[f32], dim: usize) -> (f64, Vec<f64>, Vec<f32>) {
    let n = texts.len() / dim;
    let mut cosines = Vec::with_capacity(n);
    let mut d = vec![0.0f32; texts.len()];
    for i in 0..n {
        let v = &images[i * dim..(i + 1) * dim];
        let t = &texts[i * dim..(i + 1) * dim];
        let norm = t
            .iter()
            .map(|&x| x as f64 * x as f64)
            .sum::<f64>()
            .sqrt()
            .max(1e-12);
        let cos = v
            .iter()
            .zip(t)
            .map(|(&a, &b)| a as f64 * b as f64)
            .sum::<f64>()
            / norm;
        // d(-cos / n) / dt = -(v - cos * t / |t|) / (n |t|).
        for (k, out) in d[i * dim..(i + 1) * dim].iter_mut().enumerate() {
            let unit = t[k] as f64 / norm;
            *out = (-(v[k] as f64 - cos * unit) / (n as f64 * norm)) as f32;
        }
        cosines.push(cos);
    }
    let loss = -cosines.iter().sum::<f64>() / n.max(1) as f64;
    (loss, cosines, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::vocab::{BOS, EOS, PAD, UNK, Vocab};

    fn words(list: &[&str]) -> Vec<String> {
        list.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn words_map_by_name_and_unknown_words_become_unk() {
        let captioner = CaptionVocab::from_words(words(&["a", "red", "zebra", "circle", "##red"]));
        let retriever = Vocab::from_words(words(&["circle", "a", "red"]));
        let reader = CaptionReader::Words(retriever.clone());
        let map = VocabMap::new(&captioner, &reader).unwrap();
        let id = |v: &Vocab, w: &str| vec![v.id(w)];
        let own = captioner.word_list().unwrap();
        assert_eq!(map.pieces(own.id("a")), id(&retriever, "a"));
        assert_eq!(map.pieces(own.id("circle")), id(&retriever, "circle"));
        assert_eq!(map.pieces(own.id("zebra")), [UNK]);
        assert_eq!(map.pieces(own.id("##red")), id(&retriever, "red"));
        assert_eq!(map.pieces(10_000), [UNK]);
        // A caption reads as the retriever's own encoding of its words.
        let generated: Vec<u32> = ["a", "red", "zebra", "circle"]
            .iter()
            .map(|w| own.id(w))
            .chain([EOS, own.id("a")])
            .collect();
        let tokens: Vec<String> = ["a", "red", "zebra", "circle"].map(String::from).to_vec();
        let read = |ids: &[u32], max_len| read_caption(&captioner, &reader, ids, max_len).unwrap();
        assert_eq!(read(&generated, 16), retriever.encode(&tokens, 16));
        assert_eq!(read(&generated, 4), retriever.encode(&tokens, 4));
        assert_eq!(read(&[EOS], 16), vec![BOS, UNK, EOS]);
        // The start and padding are no words; an alternative reads as its word.
        let alternative = own.id("##red");
        assert_eq!(
            read(&[BOS, own.id("a"), PAD, alternative, EOS], 16),
            retriever.encode(&words(&["a", "red"]), 16)
        );
    }

    /// A captioner of BPE pieces (the tiny GPT-2's): a word it writes as
    /// several pieces reaches the retriever as that one word.
    #[test]
    fn a_word_of_several_pieces_reads_as_one_word() {
        let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpt2-tiny");
        let bpe = crate::data::bpe::BpeVocab::load(&folder).unwrap();
        let ids = bpe.len() + 1;
        let captioner = CaptionVocab::from_tokenizer(bpe, ids).unwrap();
        let retriever = Vocab::from_words(words(&["a", "striped", "square"]));
        let reader = CaptionReader::Words(retriever.clone());
        let caption = words(&["a", "striped", "square"]);
        let ids = captioner.encode(&caption, 16).unwrap();
        let split = (ids.iter())
            .filter(|&&id| captioner.spelled(id) == "striped")
            .count();
        assert!(ids.len() > 5 && split == 0, "striped is split: {ids:?}");
        let read = read_caption(&captioner, &reader, &ids[1..], 16).unwrap();
        assert_eq!(read, retriever.encode(&caption, 16));
        assert!(!read.contains(&UNK), "{read:?}");
    }

    /// The relaxed listener's layout: each caption's tower ids are
    /// `VocabMap::caption`'s, a word of k pieces takes k positions, slot j
    /// of a token points at its j-th piece's row and back, pieces past the
    /// slots and an end written over a cut piece carry no row.
    #[test]
    fn relaxed_captions_take_a_position_per_piece() {
        let captioner = CaptionVocab::from_words(words(&["one", "two", "long"]));
        let own = captioner.word_list().unwrap();
        let (one, two, long) = (own.id("one"), own.id("two"), own.id("long"));
        let mut pieces = vec![Vec::new(); captioner.len()];
        pieces[EOS as usize] = vec![101];
        pieces[one as usize] = vec![10];
        pieces[two as usize] = vec![20, 21];
        pieces[long as usize] = vec![30, 31, 32, 33, 34, 35];
        let map = VocabMap {
            pieces,
            specials: captioner.specials(),
            framing: Framing {
                begin: 100,
                end: 101,
                empty: Vec::new(),
            },
        };
        let (positions, max_len, slots) = (4, 8, RELAXED_PIECES);
        let captions = vec![
            vec![one, two, EOS],
            vec![EOS],
            vec![long, two, long, EOS],
            vec![],
        ];
        let l = map.layout(&captions, positions, max_len, slots);
        assert_eq!(l.sequences[0], [100, 10, 20, 21, 101]);
        assert_eq!(l.sequences[1], [100, 101]);
        // Cut at 8: the end over "two"'s first piece, "long"'s last two
        // pieces past the slots.
        assert_eq!(l.sequences[2], [100, 30, 31, 32, 33, 34, 35, 101]);
        assert_eq!(l.sequences[3], [100, 101]);
        for j in 0..slots {
            for (tower, &row) in l.sources[j].iter().enumerate() {
                if row != NO_ROW {
                    assert_eq!(l.tower_rows[j][row as usize], tower as u32, "slot {j}");
                }
            }
            for (row, &tower) in l.tower_rows[j].iter().enumerate() {
                if tower != NO_ROW {
                    assert_eq!(l.sources[j][tower as usize], row as u32, "slot {j}");
                }
            }
        }
        let row = |c: usize, t: usize| c * positions + t;
        // "two" in caption 0: slots 0 and 1 at tower positions 2 and 3.
        assert_eq!(l.tower_rows[0][row(0, 1)], 2);
        assert_eq!(l.tower_rows[1][row(0, 1)], 3);
        // "long" in caption 2: four slots, positions 1..=4; 5 and 6 none.
        for j in 0..slots {
            assert_eq!(l.tower_rows[j][row(2, 0)], (2 * max_len + 1 + j) as u32);
        }
        for position in [5, 6, 7] {
            assert!((0..slots).all(|j| l.sources[j][2 * max_len + position] == NO_ROW));
        }
        // "two" in caption 2 was cut: no slot keeps it.
        assert!((0..slots).all(|j| l.tower_rows[j][row(2, 1)] == NO_ROW));
        assert_eq!(l.chosen[row(2, 1)], two);
    }
}
