//! Every objective of the registry: hand computations of each step,
//! finite differences, GPU against CPU, the direction each one moves a
//! captioner, and an objective written outside the crate.

mod blip_objectives;
mod captioner;
mod direction;
mod gpt2_objectives;
mod lstm_objectives;
mod objective_toy;
mod retrieval_objectives;
mod sequence_objectives;
