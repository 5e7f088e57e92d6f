//! The command line as a user meets it, on the built binary: one convention in every
//! subcommand's `--help` (`-j/--json` on stdout, `-o/--output FILE`, durations with units,
//! selectors with `pod:` and `container:`, help for every option, `--log` last, the exit codes),
//! the older flag spellings that still work and warn, and the answers that used to be wrong (a
//! closed stdout, `analyze` on a file with no record, `--iterations 0`, selector errors, `queues`
//! without /dev/kfd, `doctor` without amdgpu). Host-side: nothing here needs root, a GPU or a VM.

use std::{
    fs,
    path::Path,
    process::{Command, Output, Stdio},
};

const BIN: &str = env!("CARGO_BIN_EXE_gpreempt");

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).env_remove("GPREEMPT_LOG").stdin(Stdio::null()).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// One entry of a help's "Options:" or "Arguments:" list.
#[derive(Debug)]
struct Entry {
    /// `-j, --json`, `--hold <DURATION>`, `<SEL>`.
    head: String,
    help: String,
}

/// The entries of `gpreempt SUB --help` (long help: the description under each entry).
fn entries(help: &str) -> Vec<Entry> {
    let mut out: Vec<Entry> = Vec::new();
    let mut inside = false;
    for line in help.lines() {
        // "Options:", "Arguments:" and the headings of flattened groups ("Scheduler settings …:").
        if !line.starts_with(' ') && line.ends_with(':') {
            inside = true;
            continue;
        }
        if !line.starts_with(' ') && !line.is_empty() {
            inside = false;
            continue;
        }
        if !inside || line.trim().is_empty() {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        if indent < 10 {
            out.push(Entry { head: line.trim().to_owned(), help: String::new() });
        } else if let Some(e) = out.last_mut() {
            e.help.push_str(line.trim());
            e.help.push(' ');
        }
    }
    out
}

/// What each subcommand must show: (name, prints JSON, writes a file with -o, takes selectors,
/// its duration flags).
const SUBCOMMANDS: [(&str, bool, bool, bool, &[&str]); 10] = [
    ("doctor", true, false, false, &[]),
    (
        "schedule",
        true,
        false,
        true,
        &["--idle", "--poll", "--occupancy", "--share-window", "--max-suspend", "--interval"],
    ),
    (
        "evaluate",
        true,
        true,
        true,
        &["--state-timeout", "--sample", "--idle", "--poll", "--max-suspend", "--share-window"],
    ),
    ("top", true, false, false, &["--interval"]),
    ("ps", true, false, false, &["--timeout"]),
    ("queues", true, false, true, &["--watch", "--duration"]),
    ("preempt", true, true, true, &["--hold", "--gap", "--max-suspend"]),
    ("trace", true, true, false, &["--duration", "--map-interval"]),
    ("agent", false, false, true, &[]),
    ("analyze", true, false, false, &[]),
];

/// The top-level help leads with the purpose and lists the subcommands in the order users run them.
#[test]
fn top_level_help_leads_with_the_purpose() {
    let out = run(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = text(&out.stdout);
    assert!(
        help.starts_with("gpreempt protects latency-critical GPU work from batch work sharing the same AMD GPU, on the stock\namdgpu driver"),
        "{help}"
    );
    let short = text(&run(&["-h"]).stdout);
    assert!(
        short.starts_with("Protect latency-critical GPU work from batch work on the stock AMD driver\n"),
        "{short}"
    );
    let listed: Vec<&str> = help
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    let expected: Vec<&str> = SUBCOMMANDS.iter().map(|s| s.0).chain(["help"]).collect();
    assert_eq!(listed, expected);
    assert!(help.contains("Exit status: 0 success; 1 runtime error"), "{help}");
}

#[test]
fn every_subcommand_help_follows_one_convention() {
    for (sub, json, output, selectors, durations) in SUBCOMMANDS {
        let out = run(&[sub, "--help"]);
        assert_eq!(out.status.code(), Some(0), "{sub}");
        let help = text(&out.stdout);
        let entries = entries(&help);
        assert!(entries.len() >= 2, "{sub}: {entries:?}");
        let find = |head: &str| entries.iter().find(|e| e.head == head || e.head.starts_with(&format!("{head} ")));
        // Every option has help.
        for e in &entries {
            assert!(!e.help.trim().is_empty(), "{sub}: `{}` has no help", e.head);
        }
        // --json is a stdout switch, never a file.
        match find("-j, --json") {
            Some(e) => {
                assert!(json, "{sub}");
                assert_eq!(e.head, "-j, --json", "{sub}: --json takes no value");
                assert!(e.help.contains("stdout"), "{sub}: {}", e.help);
            }
            None => assert!(!json, "{sub} has no -j, --json"),
        }
        assert!(!help.contains("--json <"), "{sub}");
        // Files are written with -o/--output.
        assert_eq!(find("-o, --output <FILE>").is_some(), output, "{sub}");
        // Durations carry their unit: the value is a DURATION, the help or default shows a unit,
        // and no visible flag is named after a unit any more.
        for flag in durations {
            let e = find(flag).unwrap_or_else(|| panic!("{sub} {flag}: {entries:?}"));
            assert!(e.head.ends_with("<DURATION>") || e.head.ends_with("<INTERVAL>"), "{sub}: {}", e.head);
            let has_unit = e.help.split(|c: char| !c.is_alphanumeric() && c != '.' && c != 'µ').any(|w| {
                let digits = w.trim_end_matches(|c: char| c.is_alphabetic() || c == 'µ');
                !digits.is_empty()
                    && digits.chars().all(|c| c.is_ascii_digit() || c == '.')
                    && ["ns", "us", "µs", "ms", "s", "m", "h"].contains(&&w[digits.len()..])
            });
            assert!(has_unit, "{sub} {flag}: no example with a unit in `{}`", e.help);
        }
        for e in &entries {
            let name = e.head.split_whitespace().find(|w| w.starts_with("--")).unwrap_or("").trim_end_matches(',');
            assert!(!name.ends_with("-ms") && !name.ends_with("-us"), "{sub}: {name} is named after a unit");
        }
        // Selectors: both forms in the help.
        assert_eq!(help.contains("pod:NAMESPACE/NAME") && help.contains("container:NAME"), selectors, "{sub}");
        // --log is the last option, the exit codes close the help.
        assert!(entries.last().unwrap().head.starts_with("--log <LOG>"), "{sub}: {:?}", entries.last());
        assert!(
            help.trim_end()
                .ends_with("`ps` exits 0 when it finds no KFD process; `doctor` exits 1 when a\ncheck fails."),
            "{sub}: {help}"
        );
    }
    // The short help (`-h`) says the same.
    let short = text(&run(&["preempt", "-h"]).stdout);
    assert!(short.contains("  -o, --output <FILE>"), "{short}");
}

#[test]
fn ps_help_says_what_the_json_is() {
    // Wrapped at the terminal width: compared word by word.
    let help = text(&run(&["ps", "--help"]).stdout).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        help.contains("Print JSON on stdout instead of a table: one object, {\"processes\": [...], \"notes\": [...]}"),
        "{help}"
    );
    assert!(!help.contains("an array of processes"), "{help}");
    assert!(help.contains("Finding no KFD process is an answer, not an error"), "{help}");
}

#[test]
fn an_old_flag_still_works_and_warns() {
    // Parsed, warned about, then run: the run fails later for want of a GPU (or of the process),
    // not as a usage error.
    let out = run(&["schedule", "--online", "4194000", "--offline", "4193999", "--idle-ms", "0.5", "--poll-us", "300"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let mut lines = stderr.lines();
    assert_eq!(
        lines.next(),
        Some("gpreempt: warning: --idle-ms is an older spelling kept as an alias: write --idle 0.5ms")
    );
    assert_eq!(
        lines.next(),
        Some("gpreempt: warning: --poll-us is an older spelling kept as an alias: write --poll 300us")
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("r.json");
    let out = run(&["preempt", "--offline", "4194000", "--json", file.to_str().unwrap(), "--hold-ms", "20"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "gpreempt: warning: `preempt --json FILE` is an older spelling kept as an alias: write -o/--output \
             {} (--json now prints the JSON on stdout)\ngpreempt: warning: --hold-ms is an older spelling kept as an \
             alias: write --hold 20ms\n",
            file.display()
        )),
        "{stderr}"
    );
    // Hidden: not in the help.
    let help = text(&run(&["schedule", "--help"]).stdout);
    assert!(!help.contains("--idle-ms"), "{help}");
}

#[test]
fn a_bare_number_duration_is_refused_with_the_unit_to_add() {
    for (args, first_line) in [
        (
            &["preempt", "--offline", "1", "--hold", "20"][..],
            "error: invalid value '20' for '--hold <DURATION>': `20` has no unit: write 20ms (units: ns, us (or µs), ms, s, m, h)",
        ),
        (
            &["schedule", "--online", "1", "--offline", "2", "--poll", "200"],
            "error: invalid value '200' for '--poll <DURATION>': `200` has no unit: write 200us (units: ns, us (or µs), ms, s, m, h)",
        ),
        (
            &["trace", "--duration", "30"],
            "error: invalid value '30' for '--duration <DURATION>': `30` has no unit: write 30s (units: ns, us (or µs), ms, s, m, h)",
        ),
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert_eq!(text(&out.stderr).lines().next(), Some(first_line), "{args:?}");
    }
}

#[test]
fn a_bad_arrival_port_or_pattern_is_refused_at_once_with_the_syntax() {
    for (args, first_line) in [
        (
            &["schedule", "--online", "1", "--offline", "2", "--arrival-port", "0"][..],
            "error: invalid value '0' for '--arrival-port <PORT>': 0 is not in 1..=65535",
        ),
        (
            &["schedule", "--online", "1", "--offline", "2", "--arrival-port", "http"],
            "error: invalid value 'http' for '--arrival-port <PORT>': invalid digit found in string",
        ),
        (
            &["schedule", "--online", "1", "--offline", "2", "--arrival-allow", r"POST\q"],
            r#"error: invalid value 'POST\q' for '--arrival-allow <PATTERN>': arrival pattern "POST\\q" has a bad escape: use \r, \n, \t, \\ or \xNN"#,
        ),
    ] {
        let started = std::time::Instant::now();
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert_eq!(text(&out.stderr).lines().next(), Some(first_line), "{args:?}");
        // Refused before anything slow starts (no probe, no /dev/kfd); generous for a loaded host.
        assert!(started.elapsed() < std::time::Duration::from_secs(1), "{args:?}: {:?}", started.elapsed());
    }
}

#[test]
fn zero_iterations_is_a_usage_error() {
    let out = run(&["preempt", "--offline", "1", "--iterations", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr).lines().next(),
        Some("error: invalid value '0' for '--iterations <N>': 0 is not in 1..=4294967295")
    );
}

#[test]
fn selector_errors_name_the_selector_as_given() {
    let out = run(&["preempt", "--offline", "pod:batch/train", "--no-trace"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.ends_with(
            "gpreempt: error: --offline pod:batch/train: no KFD process runs in a pod that matches (see `gpreempt ps` \
             for the KFD processes and their pods); start its GPU work first — processes that open /dev/kfd in it \
             later are attached then\n"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("container:pod:"), "{stderr}");
    let out = run(&["preempt", "--offline", "4194000", "--online", "container:foo"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "gpreempt: error: --online container:foo: no KFD process runs there now (see `gpreempt ps` for the KFD \
         processes)\n"
    );
    let out = run(&["schedule", "--online", "foo", "--offline", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr).lines().next(),
        Some(
            "error: invalid value 'foo' for '--online <SEL>...': `foo` is none of: a host pid, container:NAME, \
             pod:NAMESPACE/NAME, pod-label:KEY=VALUE (see `gpreempt ps` for the KFD processes)"
        )
    );
    // A malformed label selector is a usage error, refused before anything starts, with the syntax.
    let start = std::time::Instant::now();
    let out = run(&["schedule", "--online", "pod-label:gpreempt.io/role", "--offline", "1"]);
    assert!(start.elapsed() < std::time::Duration::from_secs(1), "took {:?}", start.elapsed());
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr).lines().next(),
        Some(
            "error: invalid value 'pod-label:gpreempt.io/role' for '--online <SEL>...': `pod-label:gpreempt.io/role`: \
             `gpreempt.io/role` is a set-based requirement (in, notin, exists), which gpreempt does not take; write \
             pod-label:KEY=VALUE[,KEY2=VALUE2,KEY3!=VALUE3] (kubectl's equality-based selector, e.g. \
             pod-label:gpreempt.io/role=offline)"
        )
    );
    // No runtime at the named socket: one line naming it and the fix.
    let out = run(&[
        "queues",
        "pod-label:app=x",
        "--cri-socket",
        "/nonexistent/containerd.sock",
        "--sysfs-root",
        "/nonexistent",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "gpreempt: error: queues pod-label:app=x: cannot connect to the CRI runtime at /nonexistent/containerd.sock: \
         No such file or directory (os error 2); start containerd or CRI-O, or name the runtime's socket with \
         --cri-socket PATH (agent config: cri_socket)\n"
    );
    let out = run(&["queues", "pod:batch/train", "--sysfs-root", "/nonexistent"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "gpreempt: error: queues pod:batch/train: no KFD process runs there now (see `gpreempt ps` for the KFD \
         processes)\n"
    );
}

#[test]
fn analyze_refuses_a_file_with_no_trace_record() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.jsonl");
    fs::write(&empty, "").unwrap();
    let out = run(&["analyze", empty.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout), "");
    assert_eq!(
        text(&out.stderr),
        format!(
            "gpreempt: error: {} is empty: give recordings of `gpreempt trace --json` (or `trace -o FILE`)\n",
            empty.display()
        )
    );
    let garbage = dir.path().join("garbage.jsonl");
    fs::write(&garbage, "hello\n{\"no\": \"event\"}\n").unwrap();
    let out = run(&["analyze", "--json", garbage.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        format!(
            "gpreempt: error: {} has no trace record (2 line(s), none of them trace JSON): give recordings of \
             `gpreempt trace --json` (or `trace -o FILE`)\n",
            garbage.display()
        )
    );
    // A recording is still analysed.
    let good = dir.path().join("good.jsonl");
    fs::write(&good, "{\"event\":\"queue_create\",\"pid\":7,\"comm\":\"x\",\"ts_ns\":1,\"gpu_id\":1,\"queue_id\":0}\n")
        .unwrap();
    let out = run(&["analyze", good.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// A fake /sys with one KFD process, `pid`, that has queue 3 on GPU 0x1000.
fn fake_sysfs(root: &Path, pid: u32) {
    let proc_dir = root.join(format!("class/kfd/kfd/proc/{pid}"));
    fs::create_dir_all(proc_dir.join("queues/3")).unwrap();
    fs::write(proc_dir.join("pasid"), "32770\n").unwrap();
    for (file, value) in [("gpuid", "4096"), ("type", "0"), ("size", "65536")] {
        fs::write(proc_dir.join("queues/3").join(file), format!("{value}\n")).unwrap();
    }
}

#[test]
fn queues_reads_sysfs_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id();
    fake_sysfs(dir.path(), pid);
    let sysfs = dir.path().to_str().unwrap();
    let out = run(&["queues", &pid.to_string(), "--sysfs-root", sysfs, "--json"]);
    let stderr = text(&out.stderr);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(stderr, "");
    assert_eq!(json["source"], "sysfs");
    assert_eq!(json["comm"], "sleep");
    assert_eq!(json["kfd_version"], serde_json::Value::Null, "no /dev/kfd was asked");
    assert_eq!(json["queues"][0]["queue_id"], 3);
    assert_eq!(json["queues"][0]["gpu_id"], 4096);
    let out = run(&["queues", &pid.to_string(), "--sysfs-root", sysfs]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).starts_with(&format!("pid {pid} (sleep): 1 queue(s), from sysfs\n")));
    child.kill().unwrap();
    child.wait().unwrap();
}

/// `gpreempt ARGS` with stdout a pipe nobody reads any more: every write fails with EPIPE.
fn closed_stdout(args: &[&str]) -> (Option<i32>, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(BIN).args(args).stdout(writer).stderr(Stdio::piped()).output().unwrap();
    (out.status.code(), text(&out.stderr))
}

/// Exit code of `gpreempt args` with stderr a pipe whose reader has gone, stdout discarded.
fn closed_stderr(args: &[&str]) -> Option<i32> {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Command::new(BIN).args(args).stdout(Stdio::null()).stderr(writer).status().unwrap().code()
}

#[test]
fn a_closed_stderr_is_no_panic() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id().to_string();
    let sysfs = dir.path().join("sys");
    fake_sysfs(&sysfs, child.id());
    let sysfs = sysfs.to_str().unwrap();
    // Each writes notes, warnings or its error to stderr; `ps --hw` panicked (101) before.
    for (args, codes) in [
        (&["ps", "--hw"][..], &[Some(0), Some(1)][..]),
        (&["ps", "--sysfs-root", sysfs], &[Some(0)]),
        (&["queues", &pid, "--sysfs-root", sysfs], &[Some(0)]),
        (&["analyze", "/dev/null"], &[Some(1)]),
        (&["doctor"], &[Some(0), Some(1)]),
        (&["schedule", "--online", "4194000", "--offline", "4193999"], &[Some(1)]),
        (&["preempt", "--offline", "4193999", "--iterations", "1"], &[Some(1)]),
        (&["bogus"], &[Some(2)]),
    ] {
        let code = closed_stderr(args);
        assert!(codes.contains(&code), "{args:?}: exit {code:?}");
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn a_closed_stdout_is_no_panic() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.jsonl");
    fs::write(&good, "{\"event\":\"queue_create\",\"pid\":7,\"comm\":\"x\",\"ts_ns\":1,\"gpu_id\":1,\"queue_id\":0}\n")
        .unwrap();
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id().to_string();
    let sysfs = dir.path().join("sys");
    fake_sysfs(&sysfs, child.id());
    let sysfs = sysfs.to_str().unwrap();
    // doctor fails a check on a host without a GPU: its documented 1, not a panic's 101.
    let doctor_codes = [Some(0), Some(1)];
    for (args, codes) in [
        (&["doctor"][..], &doctor_codes[..]),
        (&["doctor", "--json"], &doctor_codes),
        (&["analyze", good.to_str().unwrap()], &[Some(0)]),
        (&["analyze", "--json", good.to_str().unwrap()], &[Some(0)]),
        (&["ps", "--sysfs-root", sysfs], &[Some(0)]),
        (&["ps", "--json", "--sysfs-root", sysfs], &[Some(0)]),
        (&["queues", &pid, "--sysfs-root", sysfs], &[Some(0)]),
        (&["queues", &pid, "--json", "--sysfs-root", sysfs], &[Some(0)]),
        (&["--help"], &[Some(0)]),
        (&["preempt", "--help"], &[Some(0)]),
        (&["--version"], &[Some(0)]),
    ] {
        let (code, stderr) = closed_stdout(args);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(!stderr.contains("Broken pipe"), "{args:?}: {stderr}");
        assert!(codes.contains(&code), "{args:?}: exit {code:?}: {stderr}");
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn ps_finding_nothing_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("class/kfd/kfd/proc")).unwrap();
    let out = run(&["ps", "--json", "--sysfs-root", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["processes"], serde_json::json!([]));
}

#[test]
fn doctor_without_amdgpu_says_so_once() {
    if Path::new("/dev/kfd").exists() {
        eprintln!("skipped: this host has /dev/kfd");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let proc_root = dir.path().join("proc");
    fs::create_dir_all(proc_root.join("sys/kernel")).unwrap();
    fs::write(proc_root.join("kallsyms"), "ffffffff81000000 T _stext\n").unwrap();
    fs::write(proc_root.join("sys/kernel/osrelease"), "6.12.0\n").unwrap();
    let sys = dir.path().join("sys");
    fs::create_dir_all(&sys).unwrap();
    let out = run(&["doctor", "--sysfs-root", sys.to_str().unwrap(), "--proc-root", proc_root.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout.matches("amdgpu is not loaded").count(), 1, "{stdout}");
    assert_eq!(stdout.matches("modprobe").count(), 1, "{stdout}");
    assert!(!stdout.contains("KFD < 1.13"), "{stdout}");
    assert!(stdout.contains("FAIL  amdgpu                       amdgpu is not loaded (no /dev/kfd"), "{stdout}");
    assert_eq!(text(&out.stderr), "gpreempt: error: 1 check(s) failed\n");
}

#[test]
fn agent_check_validates_a_config_and_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.toml");
    fs::write(&good, "[[policy]]\nname = \"a\"\nonline = [\"pod:serving/*\"]\noffline = [4242]\nidle_ms = 5\n")
        .unwrap();
    let out = run(&["agent", "--check", good.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), format!("{}: valid, 1 policy: a\n", good.display()));
    assert_eq!(
        text(&out.stderr),
        format!(
            "gpreempt: warning: {}, line 5: `idle_ms = 5` is an older spelling kept as an alias: write idle = \"5ms\"\n",
            good.display()
        )
    );

    let bad = dir.path().join("bad.toml");
    fs::write(
        &bad,
        "[[policy]]\nname = \"a\"\nonline = [\"pod:serving/*\"]\noffline = [\"pod:batch/*\"]\n\
         [[policy]]\nname = \"b\"\nonline = [\"pod:batch/eval-0\"]\noffline = [\"pod:serving/vllm-0\"]\n",
    )
    .unwrap();
    let out = run(&["agent", "--check", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout), "");
    let b = bad.display();
    assert_eq!(
        text(&out.stderr),
        format!(
            "gpreempt: error: {b}, line 8: policy `b` holds pod:serving/vllm-0 offline, but policy `a` (line 3) runs \
             pod:serving/* online: a process of both would be held and protected at once; narrow one of them\n\
             {b}, line 7: policy `b` runs pod:batch/eval-0 online, but policy `a` (line 4) holds pod:batch/* \
             offline: a process of both would be held and protected at once; narrow one of them\n"
        )
    );

    let out = run(&["agent", "--check", dir.path().join("missing.toml").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).starts_with("gpreempt: error: cannot read "), "{}", text(&out.stderr));
}

#[test]
fn ps_wait_new_says_what_it_waits_for_and_ends_at_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path().to_str().unwrap();
    // Without KFD: an error at once, nothing waited for.
    let started = std::time::Instant::now();
    let out = run(&["ps", "--wait-new", "--sysfs-root", sys]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        format!(
            "gpreempt: error: {sys}/class/kfd/kfd/proc does not exist: the KFD driver is not loaded (run `modprobe \
             amdgpu`) or the path is wrong\n"
        )
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5));

    // With KFD and one process already there: the line says what it waits for, then the bound ends it.
    fake_sysfs(dir.path(), 4242);
    let out = run(&["ps", "--wait-new", "--container", "trainer", "--timeout", "300ms", "--sysfs-root", sys]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout), "");
    assert_eq!(
        text(&out.stderr),
        "gpreempt: waiting for a new KFD process in container trainer (a pid that opens /dev/kfd from now on; 1 \
         already present), giving up after 300ms (--timeout)\n\
         gpreempt: error: no new KFD process in container trainer appeared within 0.3 s\n"
    );

    // The default bound is said too; --timeout without --wait-new is a usage error.
    let help = text(&run(&["ps", "--help"]).stdout);
    assert!(help.contains("[default: 10m]"), "{help}");
    assert_eq!(run(&["ps", "--timeout", "1s", "--sysfs-root", sys]).status.code(), Some(2));
}

#[test]
fn evaluate_refuses_a_load_program_that_is_not_there_as_a_usage_error() {
    let out = run(&["evaluate", "--online", "1", "--offline", "2", "--load", "/nonexistent/loadgen --rps 5"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with(
            "error: invalid value '/nonexistent/loadgen --rps 5' for '--load <COMMAND>': --load: \
             \"/nonexistent/loadgen\" is not an executable file"
        ),
        "{stderr}"
    );
}
