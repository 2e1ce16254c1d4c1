//! The decoder families ([`super::decoder::Decoder`]), one module each.

pub mod blip;
pub mod lstm;
pub mod prefix;

use super::decoder::Decoder;
use super::{CaptionerConfig, DecoderFamily, LstmModel};
use crate::backend::Backend;
use lstm::network::Recurrent;

/// A decoder of any family. An enum, not a boxed trait object, so that a
/// captioner is `Send` exactly where its backend's tensors are (the
/// desktop app hands CPU models between threads).
pub(super) enum Family<B: Backend> {
    Prefix(prefix::PrefixDecoder<B>),
    Blip(blip::BlipDecoder<B>),
    Lstm(lstm::LstmDecoder<B>),
    UpDown(lstm::updown::UpDownDecoder<B>),
    Att2in(lstm::att2in::Att2inDecoder<B>),
}

impl<B: Backend> Family<B> {
    /// The family `config` names, with fresh weights from `seed`.
    pub(super) fn new(b: &B, config: CaptionerConfig, seed: u64) -> Self {
        match config.family {
            DecoderFamily::Prefix => Family::Prefix(prefix::PrefixDecoder::new(b, config, seed)),
            DecoderFamily::Blip => Family::Blip(blip::BlipDecoder::new(b, config, seed)),
            DecoderFamily::Lstm => match config.lstm.map(|l| l.model) {
                Some(LstmModel::UpDown) => {
                    Family::UpDown(Recurrent::new(lstm::updown::UpDown::new(b, config, seed)))
                }
                Some(LstmModel::Att2in) => {
                    Family::Att2in(Recurrent::new(lstm::att2in::Att2in::new(b, config, seed)))
                }
                _ => Family::Lstm(Recurrent::new(lstm::Lstm::new(b, config, seed))),
            },
        }
    }

    pub(super) fn get(&self) -> &dyn Decoder<B> {
        match self {
            Family::Prefix(d) => d,
            Family::Blip(d) => d,
            Family::Lstm(d) => d,
            Family::UpDown(d) => d,
            Family::Att2in(d) => d,
        }
    }

    pub(super) fn get_mut(&mut self) -> &mut dyn Decoder<B> {
        match self {
            Family::Prefix(d) => d,
            Family::Blip(d) => d,
            Family::Lstm(d) => d,
            Family::UpDown(d) => d,
            Family::Att2in(d) => d,
        }
    }
}
