//! The ROCm runtime a process maps: every `libhsa-runtime64.so*` in `/proc/PID/maps`, whatever
//! its directory (a PyTorch wheel bundles its own copy in `torch/lib/`; a container's lives in the
//! container's root).
//!
//! Each is named by `/proc/PID/map_files/START-END` of its first mapping: that path opens the
//! very file mapped (through any mount namespace, and even after the file was replaced or deleted
//! on disk), so the symbol offsets and the uprobe's inode are those the process runs. Opening
//! `map_files` needs CAP_SYS_ADMIN, which loading the probe needs anyway.

use std::{fs, path::PathBuf};

use crate::domain::HostPid;

/// File names that are the ROCm runtime (`libhsa-runtime64.so`, `.so.1`, `.so.1.13.0`, …).
const RUNTIME: &str = "libhsa-runtime64.so";

/// One runtime library mapped by a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeLibrary {
    /// The path as the process sees it (in its own mount namespace), for reports.
    pub path: String,
    /// `/proc/PID/map_files/START-END` of its first mapping: what symbols are read from and the
    /// uprobe is attached to.
    pub open_path: PathBuf,
    /// `(device, inode)` as `maps` gives them: two mappings of one file are one library.
    pub file: (String, u64),
    /// Every mapping of it: (start, end, file offset), for translating between its file offsets
    /// and the process's addresses.
    pub mappings: Vec<(u64, u64, u64)>,
}

impl RuntimeLibrary {
    /// Where file offset `offset` is mapped in the process.
    pub fn address_of(&self, offset: u64) -> Option<u64> {
        self.mappings.iter().find(|m| (m.2..m.2 + (m.1 - m.0)).contains(&offset)).map(|m| m.0 + offset - m.2)
    }

    /// The file offset mapped at `address`, if it lies in this library.
    pub fn offset_of(&self, address: u64) -> Option<u64> {
        self.mappings.iter().find(|m| (m.0..m.1).contains(&address)).map(|m| address - m.0 + m.2)
    }
}

/// The runtime libraries `pid` maps now (none: not a ROCm process yet, or a raw KFD client).
pub fn runtime_libraries(pid: HostPid) -> std::io::Result<Vec<RuntimeLibrary>> {
    let text = fs::read_to_string(format!("/proc/{}/maps", pid.0))?;
    Ok(parse_maps(pid, &text))
}

/// See [`runtime_libraries`]; `maps` is the text of `/proc/PID/maps`.
pub fn parse_maps(pid: HostPid, maps: &str) -> Vec<RuntimeLibrary> {
    let mut found: Vec<RuntimeLibrary> = Vec::new();
    for line in maps.lines() {
        // address perms offset dev inode path (the path may contain spaces; " (deleted)" ends a
        // replaced file's).
        let mut fields = line.splitn(6, ' ');
        let (Some(range), Some(_perms), Some(offset), Some(dev), Some(inode)) =
            (fields.next(), fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let path = fields.next().unwrap_or("").trim_start();
        let name = path.trim_end_matches(" (deleted)").rsplit('/').next().unwrap_or("");
        if !name.starts_with(RUNTIME) {
            continue;
        }
        let Ok(inode) = inode.parse::<u64>() else { continue };
        let hex = |s: &str| u64::from_str_radix(s, 16).ok();
        let mapping = range.split_once('-').and_then(|(a, b)| Some((hex(a)?, hex(b)?, hex(offset)?)));
        let file = (dev.to_owned(), inode);
        if let Some(known) = found.iter_mut().find(|l| l.file == file) {
            known.mappings.extend(mapping);
            continue;
        }
        found.push(RuntimeLibrary {
            path: path.to_owned(),
            open_path: PathBuf::from(format!("/proc/{}/map_files/{range}", pid.0)),
            file,
            mappings: mapping.into_iter().collect(),
        });
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_runtime_copy_is_found_once_with_its_map_files_path() {
        let maps = "\
7f00a0000000-7f00a0040000 r--p 00000000 fe:01 1311 /usr/lib/x86_64-linux-gnu/libhsa-runtime64.so.1.13.0
7f00a0040000-7f00a0200000 r-xp 00040000 fe:01 1311 /usr/lib/x86_64-linux-gnu/libhsa-runtime64.so.1.13.0
7f00b0000000-7f00b0010000 r--p 00000000 00:2a 77 /opt/venv/lib/python3.11/site-packages/torch/lib/libhsa-runtime64.so (deleted)
7f00c0000000-7f00c0010000 r--p 00000000 fe:01 99 /usr/lib/x86_64-linux-gnu/libhsakmt.so.1
7f00d0000000-7f00d0010000 rw-p 00000000 00:00 0 
";
        let libs = parse_maps(HostPid(42), maps);
        assert_eq!(libs.len(), 2, "{libs:?}");
        assert_eq!(libs[0].path, "/usr/lib/x86_64-linux-gnu/libhsa-runtime64.so.1.13.0");
        assert_eq!(libs[0].open_path, PathBuf::from("/proc/42/map_files/7f00a0000000-7f00a0040000"));
        assert_eq!(libs[0].file, ("fe:01".to_owned(), 1311));
        assert_eq!(libs[1].path, "/opt/venv/lib/python3.11/site-packages/torch/lib/libhsa-runtime64.so (deleted)");
        assert_eq!(libs[1].open_path, PathBuf::from("/proc/42/map_files/7f00b0000000-7f00b0010000"));
        assert!(parse_maps(HostPid(1), "garbage\n\n").is_empty());
        // Both mappings of the first library translate file offsets and addresses.
        assert_eq!(libs[0].mappings, [(0x7f00a0000000, 0x7f00a0040000, 0), (0x7f00a0040000, 0x7f00a0200000, 0x40000)]);
        assert_eq!(libs[0].address_of(0x40010), Some(0x7f00a0040010));
        assert_eq!(libs[0].offset_of(0x7f00a0040010), Some(0x40010));
        assert_eq!((libs[0].address_of(0x200000), libs[0].offset_of(0x7f00b0000000)), (None, None));
    }
}
