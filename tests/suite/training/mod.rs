//! The training run: the trainer and its run folder, resuming and kills,
//! the collapse guard, the labelled fraction, the retriever's training,
//! and the PyTorch package that continues a run.

mod captioner_train;
mod collapse;
mod labelled;
mod retriever;
mod runs;
mod torch_package;
