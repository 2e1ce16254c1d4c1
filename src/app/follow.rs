//! Following a run folder as it grows: each poll reads the complete lines
//! appended to its record files since the last one, and notices when the
//! checkpoint is rewritten. A file that shrinks means a new run replaced
//! the old one: the history starts again.

use super::history::{History, RecordFile};
use anyhow::{Context, Result};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

pub struct RunFiles {
    dir: PathBuf,
    /// Bytes consumed per record file, and lines read (for error messages).
    read: [(u64, usize); 3],
    checkpoint_time: Option<SystemTime>,
}

impl RunFiles {
    pub fn new(dir: &Path) -> RunFiles {
        RunFiles {
            dir: dir.to_path_buf(),
            read: [(0, 0); 3],
            checkpoint_time: None,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn checkpoint(&self) -> PathBuf {
        self.dir.join("checkpoint.safetensors")
    }

    /// Adds the new complete lines to `history`; returns how many.
    pub fn poll(&mut self, history: &mut History) -> Result<usize> {
        let mut added = 0;
        for (k, file) in RecordFile::ALL.into_iter().enumerate() {
            let path = self.dir.join(file.file_name());
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if meta.len() < self.read[k].0 {
                *history = History::default();
                self.read = [(0, 0); 3];
                return self.poll(history);
            }
            if meta.len() == self.read[k].0 {
                continue;
            }
            let mut f = std::fs::File::open(&path)
                .with_context(|| format!("{}: cannot read", path.display()))?;
            f.seek(SeekFrom::Start(self.read[k].0))?;
            let mut text = String::new();
            f.read_to_string(&mut text)
                .with_context(|| format!("{}: not UTF-8 text", path.display()))?;
            // A line still being written has no newline yet: leave it for the next poll.
            let complete = text.rfind('\n').map_or(0, |i| i + 1);
            for line in text[..complete].lines().filter(|l| !l.trim().is_empty()) {
                self.read[k].1 += 1;
                let origin = format!("{} line {}", path.display(), self.read[k].1);
                history.ingest(file, line, &origin)?;
                added += 1;
            }
            self.read[k].0 += complete as u64;
        }
        Ok(added)
    }

    /// The checkpoint's path when it was written since the last call.
    pub fn new_checkpoint(&mut self) -> Option<PathBuf> {
        let path = self.checkpoint();
        let time = std::fs::metadata(&path).and_then(|m| m.modified()).ok()?;
        if self.checkpoint_time == Some(time) {
            return None;
        }
        self.checkpoint_time = Some(time);
        Some(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reads_only_complete_new_lines_and_restarts_after_truncation() {
        let dir = std::env::temp_dir().join(format!(
            "captune-follow-{}",
            crate::tensorfile::temporary_suffix()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("log.jsonl");
        let line = |step: usize| {
            format!(
                r#"{{"step":{step},"epoch":1,"objective":"mle","loss":2.0,"mle":2.0,"smile":1.0,"lr":0.001,"tokens_per_s":1.0}}"#
            )
        };
        std::fs::write(&path, format!("{}\n{}", line(1), &line(2)[..20])).unwrap();
        let (mut files, mut h) = (RunFiles::new(&dir), History::default());
        assert_eq!(files.poll(&mut h).unwrap(), 1);
        let rest = &line(2)[20..];
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        writeln!(f, "{rest}").unwrap();
        assert_eq!(files.poll(&mut h).unwrap(), 1);
        assert_eq!(files.poll(&mut h).unwrap(), 0);
        assert_eq!(h.losses.iter().map(|p| p.step).collect::<Vec<_>>(), [1, 2]);
        std::fs::write(&path, format!("{}\n", line(7))).unwrap();
        files.poll(&mut h).unwrap();
        assert_eq!(h.losses.iter().map(|p| p.step).collect::<Vec<_>>(), [7]);
        std::fs::write(&path, "{oops\n").unwrap();
        let err = format!("{:#}", files.poll(&mut h).unwrap_err());
        assert!(err.contains("log.jsonl line 1"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
