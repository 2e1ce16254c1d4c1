//! A captioning prompt: ids a decoder feeds after the start and before
//! every caption, as BLIP's captioning checkpoints were trained after "a
//! picture of". Their positions are fed but never predicted, so no loss or
//! reward reads them, and decoding starts after them.

use anyhow::{Result, bail};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The prompt's ids, held inline so that a captioner's config stays `Copy`.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Prompt {
    ids: [u32; Prompt::MAX],
    len: usize,
}

impl Prompt {
    /// The most ids a prompt holds (BLIP's "a picture of" is 3).
    pub const MAX: usize = 16;

    pub fn new(ids: &[u32]) -> Result<Prompt> {
        if ids.len() > Prompt::MAX {
            bail!(
                "a prompt of {} ids is longer than the {} captune feeds",
                ids.len(),
                Prompt::MAX
            );
        }
        let mut prompt = Prompt {
            ids: [0; Prompt::MAX],
            len: ids.len(),
        };
        prompt.ids[..ids.len()].copy_from_slice(ids);
        Ok(prompt)
    }

    pub fn ids(&self) -> &[u32] {
        &self.ids[..self.len]
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for Prompt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.ids().fmt(f)
    }
}

/// A list of ids, as a checkpoint's config holds it.
impl Serialize for Prompt {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.ids().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Prompt, D::Error> {
        let ids = Vec::<u32>::deserialize(d)?;
        Prompt::new(&ids).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_reads_back_as_its_ids_and_refuses_too_many() {
        let p = Prompt::new(&[5, 8, 9]).unwrap();
        assert_eq!((p.ids(), p.len()), (&[5, 8, 9][..], 3));
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(json, "[5,8,9]");
        assert_eq!(serde_json::from_str::<Prompt>(&json).unwrap(), p);
        assert!(Prompt::default().is_empty());
        assert!(Prompt::new(&[1; Prompt::MAX + 1]).is_err());
        let e = serde_json::from_str::<Prompt>(&format!("{:?}", [1; 17])).unwrap_err();
        assert!(e.to_string().contains("longer"), "{e}");
    }
}
