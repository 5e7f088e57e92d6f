//! Result lines on stdout that survive a reader going away. `println!` panics when stdout is a
//! closed pipe (`gpreempt preempt … | head -1`: Rust ignores SIGPIPE, so the write fails with
//! EPIPE), which would skip everything after it — the `--json` record, the detach report. Lines
//! go through [`line`] instead: after EPIPE, stdout is dropped silently and the command goes on;
//! `main` then exits as usual.

use std::{
    fmt,
    io::{self, Write},
    sync::atomic::{AtomicBool, Ordering},
};

static CLOSED: AtomicBool = AtomicBool::new(false);
/// Set when stdout carries a JSON document (`preempt --json`): the text lines go to stderr.
static DIVERTED: AtomicBool = AtomicBool::new(false);

/// `println!` through [`line`].
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::commands::stdout::line(format_args!($($arg)*), true)
    };
}
/// `print!` through [`line`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::commands::stdout::line(format_args!($($arg)*), false)
    };
}
pub(crate) use {out, outln};

/// From now on [`out`]/[`outln`] write to stderr: stdout is kept for [`json`].
pub fn divert_text_to_stderr() {
    DIVERTED.store(true, Ordering::Relaxed);
}

/// Write the text to stdout (and a newline if `newline`); a closed reader ends stdout output,
/// nothing else. After [`divert_text_to_stderr`], to stderr (whose errors are ignored).
pub fn line(args: fmt::Arguments<'_>, newline: bool) {
    if DIVERTED.load(Ordering::Relaxed) {
        let _ = write_line(&mut io::stderr().lock(), args, newline);
        return;
    }
    to_stdout(args, newline);
}

/// A JSON document (and a newline) on stdout, whether or not the text is diverted.
pub fn json(text: &str) {
    to_stdout(format_args!("{text}"), true);
}

fn to_stdout(args: fmt::Arguments<'_>, newline: bool) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    if let Err(e) = write_line(&mut io::stdout().lock(), args, newline) {
        CLOSED.store(true, Ordering::Relaxed);
        if e.kind() != io::ErrorKind::BrokenPipe {
            super::stderr::line(format_args!("gpreempt: stdout: {e}; no further results are printed there"));
        }
    }
}

fn write_line(out: &mut impl Write, args: fmt::Arguments<'_>, newline: bool) -> io::Result<()> {
    out.write_fmt(args)?;
    if newline {
        out.write_all(b"\n")?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_pipe_is_an_error_value_not_a_panic() {
        let (r, w) = nix::unistd::pipe().unwrap();
        drop(r);
        let mut file = std::fs::File::from(w);
        let err = write_line(&mut file, format_args!("x {}", 1), true).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }
}
