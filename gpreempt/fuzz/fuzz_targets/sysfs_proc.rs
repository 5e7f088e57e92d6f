//! The KFD sysfs reader (`/sys/class/kfd/kfd/proc/<pid>/…`) and the /proc identity parsers over
//! arbitrary file contents: fields separated by 0xff bytes become the files of one process.
#![no_main]

use std::{fs, path::PathBuf, sync::OnceLock};

use gpreempt::host::{procinfo, sysfs};
use libfuzzer_sys::fuzz_target;

const FILES: [&str; 8] = [
    "pasid",
    "queues/3/size",
    "queues/3/type",
    "queues/3/gpuid",
    "vram_4660",
    "sdma_4660",
    "stats_4660/evicted_ms",
    "stats_4660/cu_occupancy",
];

fn root() -> &'static PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("gpreempt-fuzz-sysfs-{}", std::process::id()));
        for f in FILES {
            if let Some(dir) = root.join("42").join(f).parent() {
                fs::create_dir_all(dir).expect("temp dir");
            }
        }
        root
    })
}

fuzz_target!(|data: &[u8]| {
    let root = root();
    let mut fields = data.split(|&b| b == 0xff);
    for f in FILES {
        let _ = fs::write(root.join("42").join(f), fields.next().unwrap_or_default());
    }
    let _ = sysfs::read_process(root, 42);
    let text = String::from_utf8_lossy(data);
    let _ = procinfo::container_from_cgroup(&text);
});
