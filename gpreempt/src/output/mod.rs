//! What gpreempt writes for people and other programs, done safely when run as root:
//! [`file`] creates output files without following symlinks, [`text`] escapes strings taken from
//! other processes (`comm`, command lines, container names) before they reach a terminal.

pub mod file;
pub mod text;
