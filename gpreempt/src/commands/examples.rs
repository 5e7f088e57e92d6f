//! The EXAMPLES section of each command's man page: what a user types first, with one line saying
//! what it does. `generate::man` appends them; its test holds every page to having some.

/// Per command (`gpreempt` for the top page): (what it does, the command line).
pub const EXAMPLES: &[(&str, &[(&str, &str)])] = &[
    (
        "gpreempt",
        &[
            ("What this host supports, and what to fix:", "sudo gpreempt doctor"),
            (
                "Hold a training job's GPU queues while a serving pod has work:",
                "sudo gpreempt schedule --online 'pod:serving/vllm-*' --offline 'pod:batch/train-*'",
            ),
            ("Watch every process's queues:", "sudo gpreempt top"),
        ],
    ),
    (
        "doctor",
        &[
            ("Every check, as text; exit status 1 if one fails:", "sudo gpreempt doctor"),
            ("The same as JSON, with what the agent needs from its host:", "sudo gpreempt doctor --json"),
        ],
    ),
    (
        "schedule",
        &[
            (
                "By container, processes started later included:",
                "sudo gpreempt schedule --online container:vllm --offline container:trainer",
            ),
            (
                "By Kubernetes pod (namespace/name globs):",
                "sudo gpreempt schedule --online 'pod:serving/llm-*' --offline 'pod:batch/*'",
            ),
            (
                "By pid, with a longer idle threshold, as JSON lines:",
                "sudo gpreempt schedule --online 4242 --offline 5151 --idle 5ms --json > schedule.jsonl",
            ),
        ],
    ),
    (
        "evaluate",
        &[(
            "Does gpreempt help this service? Co-located, alone, scheduled, compared:",
            "sudo gpreempt evaluate --online container:vllm --offline container:trainer \
             --load 'vllm bench serve --num-prompts 200' --metric p99_ms='P99 TTFT \\(ms\\): +([0-9.]+)'",
        )],
    ),
    (
        "top",
        &[
            ("The live view, with the local agent's schedulers:", "sudo gpreempt top"),
            ("With the DaemonSet's agent, reached at its pod IP:", "sudo gpreempt top --agent 10.244.1.17:9464"),
            ("One snapshot as JSON:", "sudo gpreempt top --json --interval 2s"),
        ],
    ),
    (
        "ps",
        &[
            ("The KFD processes, their containers and queues:", "sudo gpreempt ps"),
            (
                "Trace the next process that opens /dev/kfd in a container (gives up after 10 minutes):",
                "sudo gpreempt trace --pid $(gpreempt ps --wait-new --container trainer --ids-only)",
            ),
        ],
    ),
    (
        "queues",
        &[
            ("One process's queues and their state:", "sudo gpreempt queues 4242"),
            ("Watched every 100 ms for 10 s:", "sudo gpreempt queues container:trainer --watch 100ms --duration 10s"),
        ],
    ),
    (
        "preempt",
        &[
            (
                "Suspend and resume a process 1000 times, recorded:",
                "sudo gpreempt preempt --offline 4242 --iterations 1000 --hold 100ms --gap 500ms -o run.json",
            ),
            ("Every process of a pod:", "sudo gpreempt preempt --offline 'pod:batch/train-0'"),
        ],
    ),
    (
        "trace",
        &[
            ("Every KFD queue event, live:", "sudo gpreempt trace"),
            ("One process for a minute, as JSON lines:", "sudo gpreempt trace --pid 4242 --duration 1m -o trace.jsonl"),
        ],
    ),
    (
        "agent",
        &[
            ("Check a configuration without starting anything:", "gpreempt agent --check /etc/gpreempt/agent.toml"),
            ("Run it (the packaged unit does this):", "sudo gpreempt agent --config /etc/gpreempt/agent.toml"),
            ("Its metrics:", "curl -s http://127.0.0.1:9464/metrics | grep ^gpreempt_scheduler"),
        ],
    ),
    ("analyze", &[("Compare the queue ids of two recorded runs:", "gpreempt analyze run1.jsonl run2.jsonl")]),
];

/// The examples of `command` (`gpreempt` for the top page).
pub fn of(command: &str) -> &'static [(&'static str, &'static str)] {
    EXAMPLES.iter().find(|(c, _)| *c == command).map_or(&[], |(_, e)| e)
}
