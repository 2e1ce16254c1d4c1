//! METEOR's paraphrase table (`paraphrase-en.gz`: records of three lines,
//! a probability METEOR ignores, a phrase and its paraphrase), as a trie
//! over the phrases' words.
//!
//! Only the records whose words all occur in the text being scored can
//! ever match, so only those are kept: the table holds 5 million records,
//! a corpus's vocabulary touches a few thousand. The kept records keep
//! their order, which decides ties in the aligner's search.

use super::java;
use anyhow::{Context, Result, bail};
use flate2::read::MultiGzDecoder;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::io::Read;
use std::path::Path;
use std::sync::mpsc::sync_channel;

/// An id for a word the table does not hold.
const UNKNOWN: i64 = -1;
/// How much of the table is inflated at a time.
const BLOCK: usize = 1 << 20;

#[derive(Default)]
struct Node {
    children: HashMap<i64, usize>,
    /// The paraphrases of the phrase that ends here, in the table's order.
    paraphrases: Vec<usize>,
}

pub struct Paraphrases {
    ids: HashMap<String, i64>,
    /// The trie, its root first.
    nodes: Vec<Node>,
    paraphrases: Vec<Vec<i64>>,
}

/// No records yet.
impl Default for Paraphrases {
    fn default() -> Self {
        Paraphrases {
            ids: HashMap::new(),
            nodes: vec![Node::default()],
            paraphrases: Vec::new(),
        }
    }
}

/// FNV-1a. Looking up the table's words is most of reading it once it is
/// inflated, and short words need no hash that resists flooding.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A line's words as `StringTokenizer` splits it (its delimiters are
/// ASCII, so bytes do).
fn tokens(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|b| java::DELIMITERS.contains(&char::from(*b)))
        .filter(|t| !t.is_empty())
}

/// The table's lines, one at a time, keeping the records worth keeping.
struct Records<'a> {
    known: HashSet<&'a [u8], BuildHasherDefault<Fnv>>,
    lines: usize,
    /// The current record's phrase, where all its words are known.
    phrase: Option<Vec<u8>>,
    table: Paraphrases,
}

impl Records<'_> {
    fn known(&self, text: &[u8]) -> bool {
        tokens(text).all(|t| self.known.contains(t))
    }

    /// Line `self.lines` of the table: a probability, a phrase or a
    /// paraphrase, by its place in its record.
    fn line(&mut self, line: &[u8]) {
        match self.lines % 3 {
            1 => self.phrase = self.known(line).then(|| line.to_vec()),
            2 => {
                // A blank phrase could only make matches of no words (the
                // jar's aligner never finishes on one).
                if let Some(phrase) = self.phrase.take()
                    && self.known(line)
                    && tokens(&phrase).next().is_some()
                    && tokens(line).next().is_some()
                {
                    self.table.add(&phrase, line);
                }
            }
            _ => {}
        }
        self.lines += 1;
    }
}

impl Paraphrases {
    /// The records of the table at `path` (gzip) whose words are all in
    /// `vocabulary`. One thread inflates while this one reads the lines.
    /// Lines end at `\n` only (Java's reader also ends them at a lone
    /// `\r`, which METEOR's table does not hold).
    pub fn read(path: &Path, vocabulary: &HashSet<&str>) -> Result<Paraphrases> {
        let shown = path.display();
        let file = std::fs::File::open(path)
            .with_context(|| format!("{shown}: cannot open the paraphrase table"))?;
        let mut records = Records {
            known: vocabulary.iter().map(|w| w.as_bytes()).collect(),
            lines: 0,
            phrase: None,
            table: Paraphrases::default(),
        };
        let (sender, blocks) = sync_channel::<std::io::Result<Vec<u8>>>(4);
        std::thread::scope(|scope| {
            scope.spawn(move || {
                let mut gz = MultiGzDecoder::new(file);
                loop {
                    let mut block = vec![0; BLOCK];
                    let read = gz.read(&mut block).map(|n| {
                        block.truncate(n);
                        block
                    });
                    let done = read.as_ref().map_or(true, Vec::is_empty);
                    if sender.send(read).is_err() || done {
                        break;
                    }
                }
            });
            // A line cut by a block's end waits here for the rest.
            let mut partial = Vec::new();
            for block in blocks {
                let block = block.with_context(|| format!("{shown}: cannot be read (gzip)"))?;
                let mut start = 0;
                for end in memchr::memchr_iter(b'\n', &block) {
                    if partial.is_empty() {
                        records.line(&block[start..end]);
                    } else {
                        partial.extend_from_slice(&block[start..end]);
                        records.line(&std::mem::take(&mut partial));
                    }
                    start = end + 1;
                }
                partial.extend_from_slice(&block[start..]);
            }
            if !partial.is_empty() {
                records.line(&partial);
            }
            Ok::<_, anyhow::Error>(())
        })?;
        if !records.lines.is_multiple_of(3) {
            bail!(
                "{shown}: record {} is cut short (each record is three lines: a probability, a \
                 phrase and its paraphrase); the file is damaged: get it again",
                records.lines / 3 + 1
            );
        }
        Ok(records.table)
    }

    fn id(&mut self, word: &[u8]) -> i64 {
        let word = String::from_utf8_lossy(word);
        let next = self.ids.len() as i64;
        *self.ids.entry(word.into_owned()).or_insert(next)
    }

    fn add(&mut self, phrase: &[u8], paraphrase: &[u8]) {
        let mut node = 0;
        for word in tokens(phrase) {
            let id = self.id(word);
            node = match self.nodes[node].children.get(&id) {
                Some(&child) => child,
                None => {
                    self.nodes.push(Node::default());
                    let child = self.nodes.len() - 1;
                    self.nodes[node].children.insert(id, child);
                    child
                }
            };
        }
        let words = tokens(paraphrase).map(|w| self.id(w)).collect();
        self.paraphrases.push(words);
        self.nodes[node]
            .paraphrases
            .push(self.paraphrases.len() - 1);
    }

    /// The table's id of `word`.
    pub fn id_of(&self, word: &str) -> i64 {
        self.ids.get(word).copied().unwrap_or(UNKNOWN)
    }

    /// Every phrase of `line` starting at `start` that the table holds, as
    /// its length and one of its paraphrases: shorter phrases first, each
    /// phrase's paraphrases in the table's order.
    pub fn phrases_at(&self, line: &[i64], start: usize) -> Vec<(usize, &[i64])> {
        let mut out = Vec::new();
        let mut node = 0;
        for (i, id) in line[start..].iter().enumerate() {
            let Some(&child) = self.nodes[node].children.get(id) else {
                break;
            };
            node = child;
            out.extend(
                self.nodes[node]
                    .paraphrases
                    .iter()
                    .map(|&p| (i + 1, self.paraphrases[p].as_slice())),
            );
        }
        out
    }
}
