//! When the agent reloads its configuration: once per change of the file's *content*, noticed by
//! a watch on the directory that holds it (no signal needed: a Kubernetes pod's image has no
//! shell or `kill`) or asked for with SIGHUP.
//!
//! The watch is on the directory, not the file. The kubelet updates a ConfigMap volume
//! atomically (`pkg/volume/util/atomic_writer.go`): it writes the new keys into a new
//! timestamped directory `..2026_…`, points a new symlink `..data_tmp` at it, renames that over
//! `..data`, and removes the old directory; `agent.toml` itself is a symlink to
//! `..data/agent.toml` that never changes. A watch on the file would follow the first symlink to
//! the old directory's file, which is deleted, not written: it never sees an update. In the
//! directory, the rename is an `IN_MOVED_TO` of `..data`.
//!
//! Every event in the directory re-reads the file and compares the bytes with the last ones read:
//! the kubelet's steps before the rename, a swap that leaves the content as it was, and a SIGHUP
//! after a watched write reload nothing.

use std::{
    io,
    os::fd::{AsFd, AsRawFd, RawFd},
    path::{Path, PathBuf},
};

use nix::{
    errno::Errno,
    sys::inotify::{AddWatchFlags, InitFlags, Inotify},
};
use tokio::io::{Interest, unix::AsyncFd};

/// What reads the directory's changes: a write closed (an in-place edit), a name renamed into
/// it (the kubelet's `..data` swap, an editor's save by rename), a name created (a new symlink,
/// `ln -sf`), and a queue overflow (events were lost: read the file anyway).
const WATCHED: AddWatchFlags = AddWatchFlags::IN_CLOSE_WRITE
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_CREATE)
    .union(AddWatchFlags::IN_ONLYDIR);

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("cannot read {path}: {cause}")]
    Read { path: String, cause: io::Error },
    #[error("cannot watch {dir} for configuration changes ({errno}): {fix}")]
    Watch { dir: String, errno: Errno, fix: &'static str },
}

/// Why a reload was looked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// An event in the watched directory.
    Watch,
    /// SIGHUP.
    Signal,
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Watch => "file-change",
            Self::Signal => "SIGHUP",
        })
    }
}

/// The configuration file and the bytes last read from it.
#[derive(Debug)]
pub struct ConfigFile {
    path: PathBuf,
    last: Vec<u8>,
}

impl ConfigFile {
    /// Read `path` for the first time: the file and its text.
    pub fn open(path: &Path) -> Result<(Self, String), ReloadError> {
        let bytes = read(path)?;
        let text = text(path, &bytes)?;
        Ok((Self { path: path.to_owned(), last: bytes }, text))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's text when its content differs from the last read (it then becomes the last
    /// read, whether the configuration it holds is accepted or not); `None` when it is the same.
    /// After a watch event a missing file is no change: an editor that deletes and recreates it
    /// causes a further event when it is back.
    pub fn changed(&mut self, trigger: Trigger) -> Result<Option<String>, ReloadError> {
        let bytes = match read(&self.path) {
            Err(ReloadError::Read { cause, .. })
                if trigger == Trigger::Watch && cause.kind() == io::ErrorKind::NotFound =>
            {
                return Ok(None);
            }
            other => other?,
        };
        if bytes == self.last {
            return Ok(None);
        }
        self.last = bytes;
        text(&self.path, &self.last).map(Some)
    }
}

fn read(path: &Path) -> Result<Vec<u8>, ReloadError> {
    std::fs::read(path).map_err(|cause| ReloadError::Read { path: path.display().to_string(), cause })
}

fn text(path: &Path, bytes: &[u8]) -> Result<String, ReloadError> {
    String::from_utf8(bytes.to_vec()).map_err(|e| ReloadError::Read {
        path: path.display().to_string(),
        cause: io::Error::new(io::ErrorKind::InvalidData, format!("not UTF-8 text: {e}")),
    })
}

/// An inotify watch on the directory holding the configuration file.
#[derive(Debug)]
pub struct DirWatch {
    inotify: Inotify,
    dir: PathBuf,
}

impl DirWatch {
    /// Watch the directory of `config` (non-blocking: [`Self::drain`] returns at once).
    pub fn new(config: &Path) -> Result<Self, ReloadError> {
        let dir = match config.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        };
        let failed = |errno: Errno| ReloadError::Watch { dir: dir.display().to_string(), errno, fix: fix(errno) };
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).map_err(failed)?;
        inotify.add_watch(&dir, WATCHED).map_err(failed)?;
        Ok(Self { inotify, dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The events queued since the last call, without waiting: how many were read.
    pub fn drain(&self) -> Result<usize, ReloadError> {
        let mut n = 0;
        loop {
            match self.inotify.read_events() {
                Ok(events) if events.is_empty() => return Ok(n),
                Ok(events) => n += events.len(),
                Err(Errno::EAGAIN) => return Ok(n),
                Err(Errno::EINTR) => {}
                Err(errno) => {
                    return Err(ReloadError::Watch { dir: self.dir.display().to_string(), errno, fix: fix(errno) });
                }
            }
        }
    }

    /// On the tokio runtime: [`AsyncWatch::changed`] resolves at each batch of events.
    pub fn into_async(self) -> Result<AsyncWatch, ReloadError> {
        let dir = self.dir.display().to_string();
        // SAFETY: `Fd` owns the inotify descriptor (an `OwnedFd` inside nix's `Inotify`), which the
        // `AsyncFd` owns in turn: it stays open, and `as_raw_fd` returns that same descriptor,
        // until the `AsyncFd` is dropped.
        let registered = unsafe { AsyncFd::register_with_interest(Fd(self), Interest::READABLE) };
        registered.map(|fd| AsyncWatch { fd }).map_err(|e| {
            let errno = Errno::from_raw(e.into_parts().1.raw_os_error().unwrap_or(0));
            ReloadError::Watch { dir, errno, fix: fix(errno) }
        })
    }
}

/// What to do when the kernel refuses the watch.
fn fix(errno: Errno) -> &'static str {
    match errno {
        Errno::ENOSPC => {
            "the user's inotify watches are used up: raise fs.inotify.max_user_watches; until then reload with SIGHUP"
        }
        Errno::EMFILE => {
            "the user's inotify instances are used up: raise fs.inotify.max_user_instances; until then reload with SIGHUP"
        }
        Errno::ENOENT | Errno::ENOTDIR => "the configuration's directory does not exist",
        _ => "reload with SIGHUP instead",
    }
}

/// [`AsyncFd`] wants `AsRawFd`, which nix's `Inotify` does not implement.
#[derive(Debug)]
struct Fd(DirWatch);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.inotify.as_fd().as_raw_fd()
    }
}

/// A [`DirWatch`] registered with the tokio runtime.
#[derive(Debug)]
pub struct AsyncWatch {
    fd: AsyncFd<Fd>,
}

impl AsyncWatch {
    /// Wait for events in the directory, then read them all: how many.
    pub async fn changed(&self) -> Result<usize, ReloadError> {
        loop {
            let mut ready = self.fd.readable().await.map_err(|e| ReloadError::Watch {
                dir: self.fd.get_ref().0.dir.display().to_string(),
                errno: Errno::from_raw(e.raw_os_error().unwrap_or(0)),
                fix: "reload with SIGHUP instead",
            })?;
            let n = self.fd.get_ref().0.drain()?;
            // drain() read until EAGAIN: the fd is not readable any more.
            ready.clear_ready();
            if n > 0 {
                return Ok(n);
            }
        }
    }

    pub fn dir(&self) -> &Path {
        self.fd.get_ref().0.dir()
    }
}

#[cfg(test)]
mod tests {
    use std::{fs, os::unix::fs::symlink};

    use super::*;

    const FIRST: &str = "process_grace_s = 60\n";
    const SECOND: &str = "process_grace_s = 30\n";

    /// What the agent's loop does when it wakes: read the queued events; if any, compare the
    /// file's content. The reloads this step caused (0 or 1).
    fn step(watch: &DirWatch, file: &mut ConfigFile) -> usize {
        if watch.drain().unwrap() == 0 {
            return 0;
        }
        usize::from(file.changed(Trigger::Watch).unwrap().is_some())
    }

    /// A ConfigMap volume as the kubelet lays it out: `..<timestamp>/agent.toml`, `..data` →
    /// that directory, `agent.toml` → `..data/agent.toml`.
    fn kubelet_volume(dir: &Path, content: &str) -> PathBuf {
        fs::create_dir(dir.join("..2026_11_01_00_00_00.1")).unwrap();
        fs::write(dir.join("..2026_11_01_00_00_00.1/agent.toml"), content).unwrap();
        symlink("..2026_11_01_00_00_00.1", dir.join("..data")).unwrap();
        symlink("..data/agent.toml", dir.join("agent.toml")).unwrap();
        dir.join("agent.toml")
    }

    /// The kubelet's update, one syscall-level step at a time, with the agent waking after
    /// each: a new timestamped directory with the new content, a `..data_tmp` symlink to it
    /// renamed over `..data`, the old directory removed. The reloads it caused.
    fn kubelet_update(dir: &Path, watch: &DirWatch, file: &mut ConfigFile, content: &str) -> usize {
        let new = "..2026_11_01_00_01_00.2";
        let mut reloads = 0;
        fs::create_dir(dir.join(new)).unwrap();
        reloads += step(watch, file);
        fs::write(dir.join(new).join("agent.toml"), content).unwrap();
        reloads += step(watch, file);
        symlink(new, dir.join("..data_tmp")).unwrap();
        reloads += step(watch, file);
        assert_eq!(file.changed(Trigger::Watch).unwrap(), None, "nothing changed before the rename");
        fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
        reloads += step(watch, file);
        fs::remove_dir_all(dir.join("..2026_11_01_00_00_00.1")).unwrap();
        reloads += step(watch, file);
        reloads
    }

    #[test]
    fn a_kubelet_configmap_swap_reloads_exactly_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = kubelet_volume(dir.path(), FIRST);
        let (mut file, text) = ConfigFile::open(&path).unwrap();
        assert_eq!(text, FIRST);
        let watch = DirWatch::new(&path).unwrap();
        assert_eq!(watch.dir(), dir.path());
        assert_eq!(kubelet_update(dir.path(), &watch, &mut file, SECOND), 1);
        assert_eq!(fs::read_to_string(&path).unwrap(), SECOND);
        // A SIGHUP after the watch saw it: the content is the one already loaded.
        assert_eq!(file.changed(Trigger::Signal).unwrap(), None);
    }

    #[test]
    fn a_swap_to_identical_content_reloads_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = kubelet_volume(dir.path(), FIRST);
        let (mut file, _) = ConfigFile::open(&path).unwrap();
        let watch = DirWatch::new(&path).unwrap();
        assert_eq!(kubelet_update(dir.path(), &watch, &mut file, FIRST), 0);
    }

    #[test]
    fn an_in_place_write_reloads_once_with_the_new_text() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        fs::write(&path, FIRST).unwrap();
        let (mut file, _) = ConfigFile::open(&path).unwrap();
        let watch = DirWatch::new(&path).unwrap();
        fs::write(&path, SECOND).unwrap();
        assert_eq!(watch.drain().unwrap(), 1, "one IN_CLOSE_WRITE (truncation and write are IN_MODIFY, not watched)");
        assert_eq!(file.changed(Trigger::Watch).unwrap().as_deref(), Some(SECOND));
        assert_eq!(step(&watch, &mut file), 0, "no event left");
        // The same bytes written again: an event, no reload.
        fs::write(&path, SECOND).unwrap();
        assert_eq!(step(&watch, &mut file), 0);
    }

    #[test]
    fn sighup_reloads_only_a_changed_file_and_reports_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        fs::write(&path, FIRST).unwrap();
        let (mut file, _) = ConfigFile::open(&path).unwrap();
        assert_eq!(file.changed(Trigger::Signal).unwrap(), None);
        fs::write(&path, SECOND).unwrap();
        assert_eq!(file.changed(Trigger::Signal).unwrap().as_deref(), Some(SECOND));
        assert_eq!(file.changed(Trigger::Signal).unwrap(), None);

        fs::remove_file(&path).unwrap();
        assert_eq!(file.changed(Trigger::Watch).unwrap(), None, "between an editor's delete and create");
        let err = file.changed(Trigger::Signal).unwrap_err();
        assert!(matches!(&err, ReloadError::Read { cause, .. } if cause.kind() == io::ErrorKind::NotFound), "{err}");

        fs::write(&path, [0xff, 0xfe]).unwrap();
        let err = file.changed(Trigger::Signal).unwrap_err().to_string();
        assert!(err.starts_with(&format!("cannot read {}: not UTF-8 text", path.display())), "{err}");
        // Rejected bytes are the last read: the same bytes again are no change.
        assert_eq!(file.changed(Trigger::Signal).unwrap(), None);
    }

    #[test]
    fn a_directory_that_does_not_exist_cannot_be_watched_and_says_so() {
        let err = DirWatch::new(Path::new("/nonexistent-gpreempt-dir/agent.toml")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot watch /nonexistent-gpreempt-dir for configuration changes (ENOENT: No such file or directory): \
             the configuration's directory does not exist"
        );
    }

    #[test]
    fn a_bare_file_name_watches_the_current_directory() {
        // Relative to wherever the test runs; only the directory chosen is asserted.
        let watch = DirWatch::new(Path::new("agent.toml")).unwrap();
        assert_eq!(watch.dir(), Path::new("."));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_async_watch_wakes_on_a_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        fs::write(&path, FIRST).unwrap();
        let watch = DirWatch::new(&path).unwrap().into_async().unwrap();
        fs::write(&path, SECOND).unwrap();
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), watch.changed()).await.unwrap().unwrap();
        assert_eq!(n, 1);
    }
}
