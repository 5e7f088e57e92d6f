//! The audit of kernel text patches under the tests (`cargo xtask test --audit-text-pokes`, then
//! `cargo xtask text-pokes target/vm/<kernel>`). Under software emulation a site the kernel
//! live-patches while other vCPUs run has been hit on its left-over int3 (the 6.12 and 7.3
//! guests' sched_clock and memory-cgroup oopses), so docs/toolchain.md lists every patch a test
//! run causes, recorded rather than recalled.
//!
//! In the guest, before the command, kprobe events of tracefs record:
//! - `text_poke(addr, opcode, len)` (arch/x86/kernel/alternative.c): every patch of live kernel
//!   text after boot goes through it — jump labels and static calls (their batches write the
//!   int3, the tail, then the first byte), kprobes arming and disarming (`arch_arm_kprobe`),
//!   BPF trampolines (`__bpf_arch_text_poke`), ftrace — with the patched address;
//! - the static-key calls that start a jump-label patch (`static_key_enable_cpuslocked`,
//!   `static_key_disable_cpuslocked`, `static_key_slow_inc_cpuslocked`,
//!   `static_key_slow_dec_cpuslocked`, each with the key's address and a stack trace: what took
//!   the key).
//!
//! After it, the trace buffer and `/proc/kallsyms` are copied out; the summary resolves every
//! address to its symbol (modules unloaded by then stay as addresses).

use std::{collections::BTreeMap, fs, path::Path};

use anyhow::{Context, Result};

/// Guest shell run before the command (the VM script's `$GPREEMPT_VM_OUT` is the output dir).
pub const GUEST_START: &str = r#"T=/sys/kernel/tracing; [ -e $T/kprobe_events ] || mount -t tracefs nodev $T
echo 32768 > $T/buffer_size_kb
for p in 'p:gpaudit/poke text_poke addr=%di:x64 len=%dx:u64' \
  'p:gpaudit/key_enable static_key_enable_cpuslocked key=%di:x64' \
  'p:gpaudit/key_disable static_key_disable_cpuslocked key=%di:x64' \
  'p:gpaudit/key_inc static_key_slow_inc_cpuslocked key=%di:x64' \
  'p:gpaudit/key_dec static_key_slow_dec_cpuslocked key=%di:x64' \
  'p:gpaudit/jump_site arch_jump_label_transform_queue entry=%di:x64 code=+0(%di):s32' \
  'p:gpaudit/jump_now arch_jump_label_transform entry=%di:x64 code=+0(%di):s32' \
  'p:gpaudit/kprobe_arm arch_arm_kprobe addr=+40(%di):x64' \
  'p:gpaudit/ftrace_update ftrace_modify_all_code command=%di:s32' \
  'p:gpaudit/bpf_poke bpf_arch_text_poke addr=%di:x64'; do
  echo "$p" >> $T/kprobe_events 2>/dev/null && echo "probed: $p" >> "$GPREEMPT_VM_OUT/text_pokes.setup" \
    || echo "not probed: $p" >> "$GPREEMPT_VM_OUT/text_pokes.setup"
done
for e in key_enable key_disable key_inc key_dec ftrace_update bpf_poke; do
  [ -d $T/events/gpaudit/$e ] && echo stacktrace > $T/events/gpaudit/$e/trigger
done
echo 1 > $T/events/gpaudit/enable
"#;

/// Guest shell run after the command (its status is in `$rc`).
pub const GUEST_STOP: &str = r#"echo 0 > $T/events/gpaudit/enable
cat $T/trace > "$GPREEMPT_VM_OUT/text_pokes.trace"; cat $T/buffer_total_size_kb $T/per_cpu/cpu*/stats > "$GPREEMPT_VM_OUT/text_pokes.stats" 2>&1
# Per probe, its hits and misses: a run that recorded nothing shows its probes were in place.
cat $T/kprobe_profile > "$GPREEMPT_VM_OUT/text_pokes.profile" 2>&1
cp /proc/kallsyms "$GPREEMPT_VM_OUT/kallsyms"
for e in key_enable key_disable key_inc key_dec ftrace_update bpf_poke; do
  [ -d $T/events/gpaudit/$e ] && echo '!stacktrace' > $T/events/gpaudit/$e/trigger
done
echo > $T/kprobe_events
"#;

/// Events that name one patched site (the others name a key or an ftrace update).
const SITE_EVENTS: &[&str] = &["poke", "jump_site", "jump_now", "kprobe_arm", "bpf_poke"];

/// Symbols by address, for resolving the trace's addresses.
struct Symbols(Vec<(u64, String)>);

impl Symbols {
    fn parse(kallsyms: &str) -> Self {
        let mut v: Vec<(u64, String)> = kallsyms
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let addr = u64::from_str_radix(f.next()?, 16).ok()?;
                let _kind = f.next()?;
                let name = f.next()?;
                let module = f.next().map(|m| format!(" {m}")).unwrap_or_default();
                (addr != 0).then(|| (addr, format!("{name}{module}")))
            })
            .collect();
        v.sort();
        Self(v)
    }

    /// `symbol [module]` of the function holding `addr`, or the address.
    fn name(&self, addr: u64) -> String {
        match self.0.partition_point(|(a, _)| *a <= addr) {
            0 => format!("{addr:#x}"),
            i => self.0[i - 1].1.clone(),
        }
    }
}

/// One traced call: its event and its `addr=`/`key=` value, with the stack that followed it.
#[derive(Debug, PartialEq)]
struct Record {
    event: String,
    value: u64,
    stack: Vec<String>,
}

fn parse_trace(trace: &str) -> Vec<Record> {
    let mut out: Vec<Record> = Vec::new();
    for line in trace.lines() {
        if let Some(frame) = line.trim_start().strip_prefix("=> ") {
            if let Some(last) = out.last_mut() {
                last.stack.push(frame.trim().to_owned());
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        // `task-pid [cpu] flags ts: EVENT: (func+0x0/0x50) addr=0x... len=1`
        let Some((head, rest)) = line.split_once(": (") else { continue };
        let Some(event) = head.rsplit(' ').next() else { continue };
        let field = |name: &str| rest.split_whitespace().find_map(|kv| kv.strip_prefix(name));
        let hex = |v: &str| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok();
        // A jump entry's code is an s32 offset from the entry's own address.
        let value = match (field("entry="), field("code=")) {
            (Some(entry), Some(code)) => {
                hex(entry).zip(code.parse::<i64>().ok()).map(|(e, c)| e.wrapping_add_signed(c))
            }
            _ => field("addr=").or_else(|| field("key=")).and_then(hex),
        };
        if let Some(value) = value {
            out.push(Record { event: event.to_owned(), value, stack: Vec::new() });
        }
    }
    out
}

/// What triggered a key: the first frame of its stack outside the static-key and jump-label code.
fn trigger(stack: &[String]) -> String {
    stack
        .iter()
        .map(|f| f.split(['+', ' ']).next().unwrap_or(f).to_owned())
        .find(|f| {
            !f.contains("static_key")
                && !f.contains("jump_label")
                && !f.starts_with("static_branch")
                && !f.starts_with("kprobe")
                && !f.starts_with("0x")
                && !f.contains("ftrace")
        })
        .unwrap_or_else(|| "?".into())
}

/// The Markdown summary of one VM directory's recorded text patches.
pub fn summarise(dir: &Path) -> Result<String> {
    let read = |name: &str| {
        let path = dir.join(name);
        fs::read_to_string(&path).with_context(|| format!("reading {} (run with --audit-text-pokes)", path.display()))
    };
    let symbols = Symbols::parse(&read("kallsyms")?);
    let records = parse_trace(&read("text_pokes.trace")?);
    let mut sites: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut keys: BTreeMap<(String, String), u64> = BTreeMap::new();
    for r in &records {
        if SITE_EVENTS.contains(&r.event.as_str()) {
            let e = sites.entry(symbols.name(r.value)).or_default();
            e.0 += 1;
            if e.1 == 0 {
                e.1 = r.value;
            }
        } else {
            let key = if r.event == "ftrace_update" {
                format!("ftrace_modify_all_code (command {})", r.value)
            } else {
                format!("{} ({})", symbols.name(r.value), r.event.trim_start_matches("key_"))
            };
            *keys.entry((key, trigger(&r.stack))).or_default() += 1;
        }
    }
    let mut out = format!(
        "{} patched sites recorded at {} functions; {} static-key and ftrace calls\n\n| patched function | site records |\n|---|---|\n",
        records.iter().filter(|r| SITE_EVENTS.contains(&r.event.as_str())).count(),
        sites.len(),
        records.iter().filter(|r| !SITE_EVENTS.contains(&r.event.as_str())).count()
    );
    let mut by_count: Vec<_> = sites.into_iter().collect();
    by_count.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.0.cmp(&b.0)));
    for (site, (n, _)) in by_count {
        out.push_str(&format!("| `{site}` | {n} |\n"));
    }
    out.push_str("\n| static key or ftrace update (call) | taken by | calls |\n|---|---|---|\n");
    for ((key, by), n) in keys {
        out.push_str(&format!("| `{key}` | `{by}` | {n} |\n"));
    }
    if let Ok(setup) = read("text_pokes.setup") {
        out.push_str(&format!("\nProbes in the guest:\n```\n{setup}```\n"));
    }
    if let Ok(profile) = read("text_pokes.profile") {
        out.push_str(&format!("\nTheir hits and misses (kprobe_profile):\n```\n{profile}```\n"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "# tracer: nop\n\
        #\n\
        kworker/1:1-31 [001] d..1. 62.100: key_disable: (static_key_disable_cpuslocked+0x0/0x90) key=0xffffffff82a01000\n\
        kworker/1:1-31 [001] d..1. 62.100: <stack trace>\n\
         => kprobe_trace_func+0x1/0x2\n\
         => 0xffffffffc0a720de\n\
         => static_key_disable_cpuslocked+0x5/0x90\n\
         => static_key_disable+0x16/0x20\n\
         => __sched_clock_work+0x21/0x30\n\
         => process_one_work+0x17e/0x330\n\
        kworker/1:1-31 [001] d..1. 62.101: poke: (text_poke+0x0/0x50) addr=0xffffffff81100009 len=1\n\
        kworker/1:1-31 [001] d..1. 62.102: poke: (text_poke+0x0/0x50) addr=0xffffffff8110000a len=4\n\
        gpreempt-900 [000] d..1. 70.000: poke: (text_poke+0x0/0x50) addr=0xffffffffc0a00010 len=1\n\
        kworker/1:1-31 [001] d..1. 62.100: jump_site: (arch_jump_label_transform_queue+0x0/0x80) entry=0xffffffff82002000 code=-15736823\n";

    const KALLSYMS: &str = "ffffffff81100000 T sched_clock_cpu\nffffffff81100100 T sched_clock_idle\n\
        ffffffff82a01000 D __sched_clock_stable\nffffffffc0a00000 t kfd_ioctl_create_queue\t[amdgpu]\n";

    #[test]
    fn the_trace_names_each_patched_function_and_what_took_each_key() {
        let records = parse_trace(TRACE);
        assert_eq!(records.len(), 5);
        // A jump entry at ...2000 whose code offset is -0xf01ff7 names sched_clock_cpu+0x9.
        assert_eq!(records[4].value, 0xffff_ffff_8110_0009);
        assert_eq!((records[0].event.as_str(), records[0].value), ("key_disable", 0xffff_ffff_82a0_1000));
        assert_eq!(trigger(&records[0].stack), "__sched_clock_work");
        let symbols = Symbols::parse(KALLSYMS);
        assert_eq!(symbols.name(0xffff_ffff_8110_0009), "sched_clock_cpu");
        assert_eq!(symbols.name(0xffff_ffff_c0a0_0010), "kfd_ioctl_create_queue [amdgpu]");
        let dir = std::env::temp_dir().join(format!("xtask-pokes-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("kallsyms"), KALLSYMS).unwrap();
        fs::write(dir.join("text_pokes.trace"), TRACE).unwrap();
        let md = summarise(&dir).unwrap();
        assert!(md.starts_with("4 patched sites recorded at 2 functions; 1 static-key and ftrace calls\n"), "{md}");
        assert!(md.contains("| `sched_clock_cpu` | 3 |\n| `kfd_ioctl_create_queue [amdgpu]` | 1 |"), "{md}");
        assert!(md.contains("| `__sched_clock_stable (disable)` | `__sched_clock_work` | 1 |"), "{md}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
