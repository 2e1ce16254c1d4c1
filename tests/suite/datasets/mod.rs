//! The data a run reads: Karpathy and COCO files, the vocabulary, and the
//! shapes world with its facts.

mod data_loaders;
mod shapes_world;
