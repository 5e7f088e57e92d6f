//! `--offline-log FILE`: the offline job's own figures (samples/s, step time, tokens/s), taken
//! with `--offline-metric` from what it wrote to its log during each state. The job is already
//! running and its output is not ours, so the log is read as a file: its length when a state
//! starts, and the bytes after that when it ends. A log truncated or rotated meanwhile (shorter
//! at the end than at the start) is read from its beginning.

use std::{
    fs::File,
    io::{self, Read, Seek, SeekFrom},
    path::{Path, PathBuf},
};

/// The most of one state's log kept: the end of it (a job's summary lines come last).
const MAX_WINDOW: u64 = 16 << 20;

/// The part of the log written from [`LogWindow::open`] on.
#[derive(Clone, Debug)]
pub struct LogWindow {
    path: PathBuf,
    start: u64,
}

impl LogWindow {
    /// Note where the log ends now.
    pub fn open(path: &Path) -> io::Result<Self> {
        let start = File::open(path)?.metadata()?.len();
        Ok(Self { path: path.to_path_buf(), start })
    }

    /// What was written since [`Self::open`] (its last [`MAX_WINDOW`] bytes), lossily as text.
    pub fn read(&self) -> io::Result<String> {
        let mut f = File::open(&self.path)?;
        let end = f.metadata()?.len();
        let from = if end < self.start { 0 } else { self.start };
        let from = from.max(end.saturating_sub(MAX_WINDOW));
        f.seek(SeekFrom::Start(from))?;
        let mut bytes = Vec::new();
        f.take(end - from).read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn a_window_holds_what_was_appended_and_a_rotated_log_is_read_from_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.log");
        std::fs::write(&path, "step 1 samples/s 100\n").unwrap();
        let w = LogWindow::open(&path).unwrap();
        assert_eq!(w.read().unwrap(), "");
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"step 2 samples/s 120\n").unwrap();
        assert_eq!(w.read().unwrap(), "step 2 samples/s 120\n");
        // Rotated: a new, shorter file in its place.
        std::fs::write(&path, "step 3\n").unwrap();
        assert_eq!(w.read().unwrap(), "step 3\n");
        assert!(LogWindow::open(&dir.path().join("missing.log")).is_err());
    }
}
