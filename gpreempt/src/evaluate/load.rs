//! The user's load command: checked before anything starts, then run once per state through
//! `/bin/sh -c` (so pipes, redirections and environment assignments work as typed), in a process
//! group of its own so that a timeout or Ctrl-C ends all of it, with its output kept for the
//! metrics.

use std::{
    io::Read,
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use serde::Serialize;

/// The shell the command line goes through.
const SHELL: &str = "/bin/sh";
/// Output kept per stream and run: the end of it (load generators print their summary last).
const KEEP_BYTES: usize = 4 << 20;
/// How long the load's process group has after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(2);
/// Exit statuses of `sh -c` when the command was not found (127) or not executable (126), POSIX
/// "Command Search and Execution".
const SH_NOT_FOUND: i32 = 127;
const SH_NOT_EXECUTABLE: i32 = 126;

/// Why the load command cannot run.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("--load is empty: give the command that sends requests to the online service")]
    Empty,
    #[error(
        "--load: {program:?} is not an executable file{why}; give the path of your load generator (or `chmod +x` it)"
    )]
    NotExecutable { program: String, why: String },
    #[error(
        "--load: {program:?} is not found in PATH ({path}); give its full path, or run gpreempt with the PATH \
         that has it (sudo resets PATH: `sudo env PATH=\"$PATH\" gpreempt evaluate …`)"
    )]
    NotFound { program: String, path: String },
    #[error("{SHELL} is missing or cannot run ({0}): the load command goes through it")]
    Shell(std::io::Error),
    #[error("cannot start the load command: {0}")]
    Spawn(std::io::Error),
    #[error("waiting for the load command failed: {0}")]
    Wait(std::io::Error),
}

/// How a load run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadEnd {
    /// It exited (successfully or not: see the status).
    Exited,
    /// It ran past `--state-timeout` and was ended.
    TimedOut,
    /// Ctrl-C or SIGTERM ended the evaluation during the run.
    Interrupted,
}

/// One run of the load command.
#[derive(Clone, Debug)]
pub struct LoadRun {
    pub ended: LoadEnd,
    /// Its exit code (None when a signal ended it).
    pub code: Option<i32>,
    /// The signal that ended it.
    pub signal: Option<i32>,
    pub duration: Duration,
    /// Stdout, then stderr (the metrics are looked for in both).
    pub output: String,
    /// The last lines of stderr, for a failure's message.
    pub stderr_tail: String,
}

impl LoadRun {
    pub fn succeeded(&self) -> bool {
        self.ended == LoadEnd::Exited && self.code == Some(0)
    }

    /// The shell could not find or execute the command it was given.
    pub fn not_found(&self) -> bool {
        self.ended == LoadEnd::Exited && matches!(self.code, Some(SH_NOT_FOUND | SH_NOT_EXECUTABLE))
    }

    /// One line saying how it ended.
    pub fn describe(&self) -> String {
        match (self.ended, self.code, self.signal) {
            (LoadEnd::TimedOut, ..) => format!("timed out after {:.1} s and was ended", self.duration.as_secs_f64()),
            (LoadEnd::Interrupted, ..) => "interrupted".into(),
            (LoadEnd::Exited, Some(0), _) => "exited 0".into(),
            (LoadEnd::Exited, Some(c), _) => format!("exited {c}"),
            (LoadEnd::Exited, None, Some(s)) => format!("killed by signal {s}"),
            (LoadEnd::Exited, None, None) => "ended".into(),
        }
    }
}

/// The checked load command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadCommand {
    pub command: String,
}

/// Whether a word is a shell variable assignment (`NAME=value`), which may precede the program.
fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        let mut c = name.chars();
        c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
            && c.all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

fn executable(path: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| format!(" ({e})"))?;
    if !meta.is_file() {
        return Err(" (it is not a regular file)".into());
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(" (no execute permission)".into());
    }
    Ok(())
}

impl LoadCommand {
    /// Check that the command's program exists and is executable, so a typo is refused before
    /// anything else starts. Only what can be judged without running the shell is checked: a
    /// first word with quotes, `$` or parentheses is left to the first run (whose exit status 126
    /// or 127 is refused then, still before anything is held).
    pub fn check(command: &str, path_var: Option<&str>) -> Result<Self, LoadError> {
        const SHELL_SYNTAX: [char; 14] = ['\'', '"', '$', '(', ')', '`', '\\', '{', '}', ';', '|', '&', '<', '>'];
        let checked = Self { command: command.to_owned() };
        let mut words = command.split_whitespace();
        let program = loop {
            match words.next() {
                None if command.trim().is_empty() => return Err(LoadError::Empty),
                None => return Ok(checked),
                // A word the shell must expand first (`n=$(cat f)`, a quoted path): the first
                // run judges it.
                Some(w) if w.contains(SHELL_SYNTAX) => return Ok(checked),
                Some(w) if is_assignment(w) => {}
                Some(w) => break w,
            }
        };
        if program.contains('/') {
            return match executable(Path::new(program)) {
                Ok(()) => Ok(checked),
                Err(why) => Err(LoadError::NotExecutable { program: program.into(), why }),
            };
        }
        // Shell builtins and keywords a command line may start with.
        const BUILTINS: &[&str] = &[
            "exec", "cd", "export", "set", "eval", ".", "time", "!", "command", "env", "nice", "timeout", "for",
            "while", "if",
        ];
        if BUILTINS.contains(&program) {
            return Ok(checked);
        }
        let path = path_var.unwrap_or("/usr/local/bin:/usr/bin:/bin");
        let found = path
            .split(':')
            .filter(|d| !d.is_empty())
            .map(|d| PathBuf::from(d).join(program))
            .any(|p| executable(&p).is_ok());
        if found { Ok(checked) } else { Err(LoadError::NotFound { program: program.into(), path: path.into() }) }
    }

    /// Run it once: until it exits, `timeout` passes or `stop` is set (then its whole process
    /// group gets SIGTERM, and SIGKILL after [`TERM_GRACE`]). Whatever of its group is still
    /// running when the shell has exited (a background job it left) is killed too, so that the
    /// next state starts without it and its output pipes close.
    pub fn run(&self, timeout: Duration, stop: &AtomicBool) -> Result<LoadRun, LoadError> {
        if let Err(e) = std::fs::metadata(SHELL) {
            return Err(LoadError::Shell(e));
        }
        let started = Instant::now();
        let mut child = Command::new(SHELL)
            .arg("-c")
            .arg(&self.command)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group: a terminal's Ctrl-C reaches gpreempt only, which then ends the
            // state in order (the load first, then what is held).
            .process_group(0)
            .spawn()
            .map_err(LoadError::Spawn)?;
        let pgid = child.id() as libc::pid_t;
        let out = child.stdout.take().map(reader);
        let err = child.stderr.take().map(reader);
        let deadline = started + timeout;
        let (status, ended) = loop {
            match child.try_wait() {
                Ok(Some(status)) => break (Some(status), LoadEnd::Exited),
                Ok(None) => {}
                Err(e) => {
                    end_group(&mut child, pgid);
                    return Err(LoadError::Wait(e));
                }
            }
            let why = if stop.load(Ordering::Relaxed) {
                Some(LoadEnd::Interrupted)
            } else if Instant::now() >= deadline {
                Some(LoadEnd::TimedOut)
            } else {
                None
            };
            if let Some(why) = why {
                break (end_group(&mut child, pgid), why);
            }
            thread::sleep(Duration::from_millis(10));
        };
        let duration = started.elapsed();
        // Leftovers of the group (background jobs) would keep the pipes open.
        kill_group(pgid, libc::SIGKILL);
        let stdout = out.map(join).unwrap_or_default();
        let stderr = err.map(join).unwrap_or_default();
        let stderr_tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        let stderr_tail = stderr_tail.into_iter().rev().collect::<Vec<_>>().join("\n");
        Ok(LoadRun {
            ended,
            code: status.as_ref().and_then(ExitStatus::code),
            signal: status.as_ref().and_then(std::os::unix::process::ExitStatusExt::signal),
            duration,
            output: format!("{stdout}{}{stderr}", if stdout.ends_with('\n') || stdout.is_empty() { "" } else { "\n" }),
            stderr_tail,
        })
    }
}

fn kill_group(pgid: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill(2) with a negative pid signals that process group; no memory is involved. The
    // group is the load's own (process_group(0) made its leader's pid the group id) and the
    // leader is not reaped yet when the first signal goes, so the id cannot have been reused.
    unsafe { libc::kill(-pgid, signal) };
}

/// SIGTERM to the group, SIGKILL after the grace; the shell's status.
fn end_group(child: &mut Child, pgid: libc::pid_t) -> Option<ExitStatus> {
    kill_group(pgid, libc::SIGTERM);
    let until = Instant::now() + TERM_GRACE;
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if Instant::now() < until => thread::sleep(Duration::from_millis(10)),
            _ => {
                kill_group(pgid, libc::SIGKILL);
                return child.wait().ok();
            }
        }
    }
}

/// A stream read to its end on a thread, keeping its last [`KEEP_BYTES`].
fn reader(mut stream: impl Read + Send + 'static) -> JoinHandle<String> {
    thread::spawn(move || {
        let mut kept: Vec<u8> = Vec::new();
        let mut buf = [0u8; 16 << 10];
        loop {
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    kept.extend_from_slice(&buf[..n]);
                    if kept.len() > 2 * KEEP_BYTES {
                        kept.drain(..kept.len() - KEEP_BYTES);
                    }
                }
            }
        }
        if kept.len() > KEEP_BYTES {
            kept.drain(..kept.len() - KEEP_BYTES);
        }
        String::from_utf8_lossy(&kept).into_owned()
    })
}

fn join(h: JoinHandle<String>) -> String {
    h.join().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_is_checked_before_anything_runs() {
        let path = Some("/usr/bin:/bin");
        assert!(LoadCommand::check("sh -c 'echo hi'", path).is_ok());
        assert!(LoadCommand::check("FOO=1 BAR=x sh -c true", path).is_ok());
        assert!(LoadCommand::check("/bin/sh -c true", path).is_ok());
        assert!(matches!(LoadCommand::check("  ", path), Err(LoadError::Empty)));
        let e = LoadCommand::check("no-such-load-gen --rps 5", path).unwrap_err();
        assert!(matches!(&e, LoadError::NotFound { program, .. } if program == "no-such-load-gen"), "{e}");
        assert!(e.to_string().contains("/usr/bin:/bin"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("load.sh");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = LoadCommand::check(&format!("{} --rps 5", script.display()), path).unwrap_err();
        assert!(e.to_string().contains("(no execute permission)"), "{e}");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(LoadCommand::check(&format!("{} --rps 5", script.display()), path).is_ok());
        let e = LoadCommand::check("/nonexistent/load", path).unwrap_err();
        assert!(matches!(e, LoadError::NotExecutable { .. }), "{e}");
        // Left to the shell: quoting and expansions, in the program or in an assignment before it.
        assert!(LoadCommand::check("\"$HOME/bin/load\" --x", path).is_ok());
        assert!(LoadCommand::check("n=$(cat /tmp/count); exec /nonexistent/x", path).is_ok());
        assert!(LoadCommand::check("A=1", path).is_ok());
    }

    #[test]
    fn a_run_keeps_both_streams_its_status_and_ends_a_hang_at_the_timeout() {
        let stop = AtomicBool::new(false);
        let ok = LoadCommand { command: "echo p99_ms=12.5; echo warn >&2; exit 3".into() }
            .run(Duration::from_secs(30), &stop)
            .unwrap();
        assert_eq!(
            (ok.ended, ok.code, ok.output.as_str(), ok.stderr_tail.as_str()),
            (LoadEnd::Exited, Some(3), "p99_ms=12.5\nwarn\n", "warn")
        );
        assert_eq!(ok.describe(), "exited 3");
        assert!(!ok.succeeded());
        // A hang, with a background child holding the pipes: the whole group is ended.
        let hang =
            LoadCommand { command: "sleep 30 & sleep 30".into() }.run(Duration::from_millis(200), &stop).unwrap();
        assert_eq!(hang.ended, LoadEnd::TimedOut);
        assert_eq!(hang.signal, Some(libc::SIGTERM));
        assert!(hang.duration < Duration::from_secs(10), "{:?}", hang.duration);
        let missing =
            LoadCommand { command: "exec /nonexistent/x".into() }.run(Duration::from_secs(30), &stop).unwrap();
        assert!(missing.not_found(), "{missing:?}");
        stop.store(true, Ordering::Relaxed);
        let stopped = LoadCommand { command: "sleep 30".into() }.run(Duration::from_secs(30), &stop).unwrap();
        assert_eq!(stopped.ended, LoadEnd::Interrupted);
    }
}
