//! Output files created as root in directories others may write to (`/tmp`): a symlink planted at
//! the output path must not redirect the write (to `/etc/shadow`, say), and a reader must never
//! see half a record file.
//!
//! - [`write_atomically`]: a finished document (`preempt --json`). Written to a temporary file in
//!   the destination's directory, created with `O_EXCL | O_NOFOLLOW` under an unpredictable name
//!   (nobody can pre-create or link it), then renamed over the destination (rename replaces a
//!   directory entry and follows no link).
//! - [`create`]: a stream written while tracing (`trace --output/--perfetto/--summary-json`),
//!   opened with `O_NOFOLLOW`, which refuses a symlink as the last path component (ELOOP).
//!
//! Both refuse a destination that is a symlink with [`OutputError::Symlink`].

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("{0} is a symbolic link; gpreempt does not write through links (give the real path)")]
    Symlink(PathBuf),
    #[error("cannot write {path}: {cause}")]
    Io { path: PathBuf, cause: io::Error },
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> OutputError + '_ {
    move |source| OutputError::Io { path: path.to_owned(), cause: source }
}

/// Refuse `path` if it exists as a symlink (the check names the problem; `O_NOFOLLOW` and
/// `rename` are what make it safe against a link planted after the check).
fn refuse_symlink(path: &Path) -> Result<(), OutputError> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(OutputError::Symlink(path.to_owned())),
        _ => Ok(()),
    }
}

/// Create (or truncate) `path` for streaming output, never through a symlink.
pub fn create(path: &Path) -> Result<File, OutputError> {
    refuse_symlink(path)?;
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o644)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => OutputError::Symlink(path.to_owned()),
            _ => OutputError::Io { path: path.to_owned(), cause: e },
        })
}

/// Replace `path` with `bytes` in one step (see the module doc).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), OutputError> {
    refuse_symlink(path)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| OutputError::Io {
        path: path.to_owned(),
        cause: io::Error::new(io::ErrorKind::InvalidInput, "not a file name"),
    })?;
    let tmp = dir.join(format!(".{}.{:016x}.partial", name.to_string_lossy(), random_u64().map_err(io_error(path))?));
    let result = OpenOptions::new()
        .write(true)
        .create_new(true) // O_CREAT | O_EXCL
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o644)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .map_err(io_error(&tmp))
        .and_then(|()| fs::rename(&tmp, path).map_err(io_error(path)));
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// 64 bits from the kernel's CSPRNG (`getrandom(2)`), for names nobody can predict.
fn random_u64() -> io::Result<u64> {
    let mut buf = [0u8; 8];
    // SAFETY: `buf` is valid for 8 bytes of writes.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n != buf.len() as isize {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::from_ne_bytes(buf))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn a_symlinked_output_path_is_not_followed_and_its_target_is_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("shadow");
        fs::write(&victim, "root:secret\n").unwrap();
        let link = dir.path().join("out.json");
        symlink(&victim, &link).unwrap();

        let err = write_atomically(&link, b"{}").unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{} is a symbolic link; gpreempt does not write through links (give the real path)",
                link.display()
            )
        );
        assert!(matches!(create(&link), Err(OutputError::Symlink(p)) if p == link));
        assert_eq!(fs::read_to_string(&victim).unwrap(), "root:secret\n");
        assert!(fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        // Nothing else was left in the directory.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn documents_replace_the_destination_in_one_step_without_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.json");
        fs::write(&path, "old").unwrap();
        write_atomically(&path, b"{\"new\":1}").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "{\"new\":1}");
        let names: Vec<String> =
            fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["run.json"]);
        let mut f = create(&dir.path().join("trace.jsonl")).unwrap();
        f.write_all(b"x\n").unwrap();
        assert_eq!(fs::read_to_string(dir.path().join("trace.jsonl")).unwrap(), "x\n");
    }

    #[test]
    fn temporary_names_are_unpredictable() {
        assert_ne!(random_u64().unwrap(), random_u64().unwrap());
    }
}
