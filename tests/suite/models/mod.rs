//! The networks: the transformer's post-LN and cross-attending blocks,
//! BLIP's text decoder against transformers,
//! generation over the KV cache, the golden test against an
//! independent PyTorch implementation, the policy every loss reads, and
//! the pretrained families (GPT-2, ClipCap, CLIP) against transformers,
//! with export, and the LSTM captioner against PyTorch's `nn.LSTM`.

mod blip;
mod blocks;
mod clip;
mod clipcap;
mod export;
mod generation;
mod golden;
mod gpt2;
mod lstm;
mod policy;
mod self_critical;
mod torch_checkpoint;
