//! Lines for the user on stderr that never panic. `eprintln!` panics when stderr is a closed
//! pipe (`gpreempt ps --hw 2>&1 | head -1`: Rust ignores SIGPIPE, so the write fails with
//! EPIPE) or a full device, mid-command: before the queues are resumed or the record written.
//! [`errln`] writes through [`line`], which drops such an error: stderr is where progress and
//! warnings go, and losing them must not change what the command does or how it exits.

use std::{
    fmt,
    io::{self, Write},
};

/// `eprintln!` through [`line`].
macro_rules! errln {
    () => {
        $crate::commands::stderr::line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::commands::stderr::line(format_args!($($arg)*))
    };
}
pub(crate) use errln;

/// Write the text and a newline to stderr; an error (a closed reader, a full device) is ignored.
pub fn line(args: fmt::Arguments<'_>) {
    let mut err = io::stderr().lock();
    let _ = err.write_fmt(args).and_then(|()| err.write_all(b"\n"));
}
