//! Zip archives, read through their central directory, with the zip64
//! records that files over 4 GiB need: PyTorch's checkpoints (entries
//! stored, read in ranges) and Java archives (entries deflated, read
//! whole). No encryption, no multi-disk archives. Every offset and size a
//! file claims is checked against the file's length before anything is
//! read or allocated, and an entry inflates to no more than its declared
//! size.

use anyhow::{Context, Result, bail};
use flate2::read::DeflateDecoder;
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

const END_OF_DIRECTORY: u32 = 0x0605_4b50;
const ZIP64_LOCATOR: u32 = 0x0706_4b50;
const ZIP64_END_OF_DIRECTORY: u32 = 0x0606_4b50;
const DIRECTORY_ENTRY: u32 = 0x0201_4b50;
const LOCAL_HEADER: u32 = 0x0403_4b50;
const ZIP64_EXTRA: u16 = 0x0001;
const STORED: u16 = 0;
const DEFLATED: u16 = 8;
/// The end record's fixed part, and the most its comment adds.
const END_LEN: usize = 22;
const MAX_COMMENT: usize = 0xffff;

/// Where one entry's bytes lie in the file.
#[derive(Clone, Copy, Debug)]
struct Entry {
    /// The offset of the entry's local header.
    header: u64,
    /// The bytes it holds.
    size: u64,
    /// Stored or deflated.
    method: u16,
    /// The bytes it takes in the file: `size`, or its deflated length.
    stored_len: u64,
}

pub struct Archive {
    path: PathBuf,
    file: File,
    len: u64,
    entries: HashMap<String, Entry>,
}

/// Little-endian fields read from a slice, each checked to be there.
struct Fields<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Fields<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Fields { bytes, at: 0 }
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let out = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(out)
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

impl Archive {
    /// Opens `path` and reads its central directory.
    pub fn open(path: &Path) -> Result<Archive> {
        let file = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
        let len = file.metadata()?.len();
        let mut archive = Archive {
            path: path.to_path_buf(),
            file,
            len,
            entries: HashMap::new(),
        };
        let tail_len = len.min((END_LEN + MAX_COMMENT) as u64);
        let tail = archive.read_at(len - tail_len, tail_len)?;
        let found = (tail.len() >= END_LEN).then(|| {
            (0..=tail.len() - END_LEN)
                .rev()
                .find(|&i| tail[i..i + 4] == END_OF_DIRECTORY.to_le_bytes())
        });
        let Some(end) = found.flatten() else {
            bail!(
                "{}: not a zip archive (no end of central directory)",
                path.display()
            );
        };
        let end_at = len - tail_len + end as u64;
        let (count, directory_len, directory_at) = archive.directory(&tail[end..], end_at)?;
        let directory = archive.read_at(directory_at, directory_len)?;
        let mut f = Fields::new(&directory);
        for _ in 0..count {
            let (name, entry) = archive.directory_entry(&mut f)?;
            archive.entries.insert(name, entry);
        }
        Ok(archive)
    }

    /// The entry count, size and offset of the central directory, from the
    /// end record (`end`, at `end_at`) or its zip64 twin.
    fn directory(&mut self, end: &[u8], end_at: u64) -> Result<(u64, u64, u64)> {
        let path = self.path.clone();
        let bad = || corrupt(&path, "end of central directory");
        let mut f = Fields::new(end);
        f.take(4 + 2 + 2 + 2).ok_or_else(bad)?;
        let count = f.u16().ok_or_else(bad)?;
        let (size, offset) = (f.u32().ok_or_else(bad)?, f.u32().ok_or_else(bad)?);
        if count != 0xffff && size != 0xffff_ffff && offset != 0xffff_ffff {
            return Ok((u64::from(count), u64::from(size), u64::from(offset)));
        }
        let locator_at = end_at.checked_sub(20).ok_or_else(bad)?;
        let locator = self.read_at(locator_at, 20)?;
        let mut f = Fields::new(&locator);
        if f.u32() != Some(ZIP64_LOCATOR) {
            return Err(corrupt(&path, "zip64 locator"));
        }
        f.u32();
        let record_at = f.u64().ok_or_else(bad)?;
        let record = self.read_at(record_at, 56)?;
        let mut f = Fields::new(&record);
        if f.u32() != Some(ZIP64_END_OF_DIRECTORY) {
            return Err(corrupt(&path, "zip64 end of central directory"));
        }
        f.take(8 + 2 + 2 + 4 + 4 + 8).ok_or_else(bad)?;
        let count = f.u64().ok_or_else(bad)?;
        let (size, offset) = (f.u64().ok_or_else(bad)?, f.u64().ok_or_else(bad)?);
        Ok((count, size, offset))
    }

    /// One central directory entry: its name and where its bytes are.
    fn directory_entry(&self, f: &mut Fields<'_>) -> Result<(String, Entry)> {
        let bad = || corrupt(&self.path, "central directory entry");
        if f.u32() != Some(DIRECTORY_ENTRY) {
            return Err(bad());
        }
        f.take(2 + 2 + 2).ok_or_else(bad)?;
        let method = f.u16().ok_or_else(bad)?;
        f.take(2 + 2 + 4).ok_or_else(bad)?;
        let compressed = f.u32().ok_or_else(bad)?;
        let size = f.u32().ok_or_else(bad)?;
        let (name_len, extra_len, comment_len) = (
            f.u16().ok_or_else(bad)?,
            f.u16().ok_or_else(bad)?,
            f.u16().ok_or_else(bad)?,
        );
        f.take(2 + 2 + 4).ok_or_else(bad)?;
        let header = f.u32().ok_or_else(bad)?;
        let name = f.take(name_len.into()).ok_or_else(bad)?;
        let name = String::from_utf8_lossy(name).into_owned();
        let extra = f.take(extra_len.into()).ok_or_else(bad)?;
        f.take(comment_len.into()).ok_or_else(bad)?;
        if method != STORED && method != DEFLATED {
            bail!(
                "{}: entry {name:?} is compressed by method {method}; only stored and deflated \
                 entries are read",
                self.path.display()
            );
        }
        // The zip64 extra field holds, in this order, the sizes and offset
        // whose 32-bit fields are all ones.
        let (mut size, mut header) = (u64::from(size), u64::from(header));
        let mut compressed = u64::from(compressed);
        let mut extras = Fields::new(extra);
        while let (Some(id), Some(len)) = (extras.u16(), extras.u16()) {
            let mut field = Fields::new(extras.take(len.into()).ok_or_else(bad)?);
            if id != ZIP64_EXTRA {
                continue;
            }
            if size == 0xffff_ffff {
                size = field.u64().ok_or_else(bad)?;
            }
            if compressed == 0xffff_ffff {
                compressed = field.u64().ok_or_else(bad)?;
            }
            if header == 0xffff_ffff {
                header = field.u64().ok_or_else(bad)?;
            }
        }
        let stored = if method == STORED { size } else { compressed };
        if stored > self.len {
            return Err(bad());
        }
        Ok((
            name,
            Entry {
                header,
                size,
                method,
                stored_len: stored,
            },
        ))
    }

    /// The names of the entries.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// The size of entry `name`, if there is one.
    pub fn size(&self, name: &str) -> Option<u64> {
        self.entries.get(name).map(|e| e.size)
    }

    fn entry(&self, name: &str) -> Result<Entry> {
        match self.entries.get(name) {
            Some(&entry) => Ok(entry),
            None => bail!("{}: no entry {name:?}", self.path.display()),
        }
    }

    /// `len` bytes of the stored entry `name` from `offset` into it.
    pub fn read(&mut self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let entry = self.entry(name)?;
        if entry.method != STORED {
            bail!(
                "{}: entry {name:?} is compressed, so it cannot be read in parts; a checkpoint \
                 stores its tensors uncompressed, so this is not a file torch.save wrote",
                self.path.display()
            );
        }
        self.read_stored(name, entry, offset, len)
    }

    fn read_stored(&mut self, name: &str, entry: Entry, offset: u64, len: u64) -> Result<Vec<u8>> {
        if offset
            .checked_add(len)
            .is_none_or(|end| end > entry.stored_len)
        {
            bail!(
                "{}: bytes {offset}..{} of entry {name:?} asked for, but it holds {}",
                self.path.display(),
                offset.saturating_add(len),
                entry.size
            );
        }
        let header = self.read_at(entry.header, 30)?;
        let mut f = Fields::new(&header);
        if f.u32() != Some(LOCAL_HEADER) {
            return Err(corrupt(&self.path, &format!("local header of {name:?}")));
        }
        f.take(22);
        let name_len = u64::from(f.u16().unwrap_or(0));
        let extra_len = u64::from(f.u16().unwrap_or(0));
        let start = entry.header + 30 + name_len + extra_len;
        self.read_at(start + offset, len)
    }

    /// The whole of entry `name`, inflated if it is deflated.
    pub fn read_all(&mut self, name: &str) -> Result<Vec<u8>> {
        let entry = self.entry(name)?;
        let raw = self.read_stored(name, entry, 0, entry.stored_len)?;
        if entry.method == STORED {
            return Ok(raw);
        }
        let mut out = Vec::new();
        DeflateDecoder::new(raw.as_slice())
            .take(entry.size.saturating_add(1))
            .read_to_end(&mut out)
            .map_err(|e| corrupt(&self.path, &format!("deflated data of {name:?} ({e})")))?;
        if out.len() as u64 != entry.size {
            return Err(corrupt(&self.path, &format!("size of {name:?}")));
        }
        Ok(out)
    }

    /// `len` bytes from `offset` of the file, which must hold them.
    fn read_at(&mut self, offset: u64, len: u64) -> Result<Vec<u8>> {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            bail!(
                "{}: truncated: bytes {offset}..{} asked for, but the file has {}",
                self.path.display(),
                offset.saturating_add(len),
                self.len
            );
        }
        let mut out = vec![0; len as usize];
        self.file.seek(SeekFrom::Start(offset))?;
        self.file
            .read_exact(&mut out)
            .with_context(|| format!("{}: cannot read", self.path.display()))?;
        Ok(out)
    }
}

fn corrupt(path: &Path, what: &str) -> anyhow::Error {
    anyhow::anyhow!("{}: a corrupt zip archive: bad {what}", path.display())
}
