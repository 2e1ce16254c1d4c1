//! The training split as objectives and explanations see it beyond one
//! batch.

use crate::data::{Dataset, Split};

/// The training split as objectives see it beyond one batch: every
/// training image's references, over which statistics (CIDEr-D's
/// document frequencies) are computed once.
#[derive(Clone, Debug, Default)]
pub struct TrainingCorpus {
    /// The data set's name (part of the on-disk cache's key).
    pub name: String,
    /// Every training image's reference captions as PTB tokens, by the
    /// index `TrainingBatch::images` gives.
    pub references: Vec<Vec<Vec<String>>>,
    /// Every training image's embedding `[images, embed_dim]` (unit
    /// rows), in the same order; empty where no objective needs them.
    pub image_embeddings: Vec<f32>,
}

impl TrainingCorpus {
    /// A corpus called `name` (the on-disk caches' key) of images with
    /// these `references` (PTB tokens), without image embeddings.
    pub fn new(name: impl Into<String>, references: Vec<Vec<Vec<String>>>) -> Self {
        TrainingCorpus {
            name: name.into(),
            references,
            image_embeddings: Vec::new(),
        }
    }

    /// With every image's unit embedding, `[images, dim]` in corpus order.
    pub fn with_image_embeddings(mut self, embeddings: Vec<f32>) -> Self {
        self.image_embeddings = embeddings;
        self
    }

    /// The training split of `data`, and the item of each corpus image.
    pub fn training_split(data: &Dataset) -> (TrainingCorpus, Vec<usize>) {
        let items: Vec<usize> = (0..data.items.len())
            .filter(|&i| data.items[i].split == Split::Train)
            .collect();
        let references = items
            .iter()
            .map(|&i| {
                let captions = &data.items[i].captions;
                captions.iter().map(|c| c.tokens.clone()).collect()
            })
            .collect();
        (TrainingCorpus::new(data.name.clone(), references), items)
    }
}
