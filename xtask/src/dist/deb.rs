//! The Debian package, assembled by hand and built with `dpkg-deb` (no debhelper, no source
//! package): the static binary, its man pages (gzipped), the bash/zsh/fish completions where each
//! shell looks for them, the systemd unit installed but not enabled, the sample agent
//! configuration (a conffile, its policy commented out), the documentation the pages and `--help`
//! cite (README.md and docs/, under /usr/share/doc/gpreempt) and the copyright file. No
//! `Depends`: the binary needs no shared object. No `Homepage`: the project has no public
//! address yet; the package's documentation is its reference.

use std::{
    fmt::Write as _,
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use super::{Generated, remove_dir};
use crate::util::{output, output_in, run as run_command, workspace_root};

/// What goes into the package.
pub struct Inputs<'a> {
    /// The Cargo version.
    pub version: &'a str,
    pub binary: &'a Path,
    pub generated: &'a Generated,
    /// deploy/gpreempt-agent.service as it is.
    pub unit: &'a str,
    /// deploy/agent.toml with its policies commented out.
    pub sample: &'a str,
}

/// Where the unit goes: /usr/lib (not /lib) is on systemd's unit path on every release (bullseye's
/// systemd 247 searches both) and where Debian puts units since the /usr merge.
pub const UNIT_PATH: &str = "usr/lib/systemd/system/gpreempt-agent.service";
pub const CONFIG_PATH: &str = "etc/gpreempt/agent.toml";
/// Where the packaged unit runs the binary from.
pub const BINARY_PATH: &str = "usr/bin/gpreempt";

/// `gpreempt_VERSION_amd64.deb`.
pub fn file_name(cargo_version: &str) -> String {
    format!("gpreempt_{}_amd64.deb", debian_version(cargo_version))
}

/// A Cargo (semver) version as Debian orders it: a pre-release sorts before its release in semver
/// (`1.0.0-rc.1 < 1.0.0`) and with `~` in Debian (a `-` would start a Debian revision).
pub fn debian_version(cargo_version: &str) -> String {
    cargo_version.replacen('-', "~", 1)
}

/// Where the documentation goes: the paths the pages cite (`docs/cli.md`) under it.
pub const DOC_DIR: &str = "usr/share/doc/gpreempt";

/// The documentation the package carries, relative to the workspace: README.md, then every
/// Markdown file under docs/, sorted.
pub fn doc_files() -> Result<Vec<String>> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) -> Result<()> {
        for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                walk(&path, root, out)?;
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path.strip_prefix(root)?.display().to_string());
            }
        }
        Ok(())
    }
    let root = workspace_root();
    let mut docs = Vec::new();
    walk(&root.join("docs"), &root, &mut docs)?;
    docs.sort();
    docs.insert(0, "README.md".to_owned());
    Ok(docs)
}

/// A man page's directory by its section, the file name's last extension (`gpreempt.1`,
/// `gpreempt-agent.toml.5`).
fn man_path(page: &str) -> String {
    let section = page.rsplit('.').next().unwrap_or("1");
    format!("usr/share/man/man{section}/{page}.gz")
}

/// Every file of the package (relative to `/`) with its mode, for these man pages and docs.
pub fn files(man_pages: &[String], docs: &[String]) -> Vec<(String, u32)> {
    let mut files = vec![(BINARY_PATH.to_owned(), 0o755)];
    files.extend(man_pages.iter().map(|page| (man_path(page), 0o644)));
    for path in [
        "usr/share/bash-completion/completions/gpreempt",
        "usr/share/zsh/vendor-completions/_gpreempt",
        "usr/share/fish/vendor_completions.d/gpreempt.fish",
        UNIT_PATH,
        CONFIG_PATH,
        "usr/share/doc/gpreempt/copyright",
    ] {
        files.push((path.to_owned(), 0o644));
    }
    files.extend(docs.iter().map(|doc| (format!("{DOC_DIR}/{doc}"), 0o644)));
    files
}

/// The sample configuration as the package installs it: every `[[policy]]` table commented out
/// (a freshly installed agent must not suspend anything), with a line saying how to enable it.
/// Lines already commented, and everything before the first policy, are left as they are.
pub fn comment_out_policies(sample: &str) -> String {
    let mut out = String::new();
    let mut in_policy = false;
    for line in sample.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            // A table header ends the previous table.
            in_policy = trimmed.starts_with("[[policy]]");
            if in_policy {
                out.push_str("# Uncomment to schedule (see `man gpreempt-agent` and `gpreempt schedule --help`):\n");
            }
        }
        if in_policy && !trimmed.is_empty() && !trimmed.starts_with('#') {
            out.push_str("# ");
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The unit as the package installs it: the binary at /usr/bin, the install lines about the
/// package. Fails when the unit no longer names /usr/local/bin/gpreempt (the path would be wrong).
pub fn packaged_unit(unit: &str) -> Result<String> {
    if !unit.contains("ExecStart=/usr/local/bin/gpreempt ") {
        bail!("deploy/gpreempt-agent.service has no `ExecStart=/usr/local/bin/gpreempt …`: update deb.rs");
    }
    let mut out = String::new();
    for line in unit.lines() {
        if line.starts_with("# Install:") {
            out.push_str("# Installed by the gpreempt package, not enabled: edit /etc/gpreempt/agent.toml, then\n");
            continue;
        }
        if line.starts_with("# ") && line.contains("/usr/local/bin/gpreempt") {
            continue;
        }
        out.push_str(&line.replace("/usr/local/bin/gpreempt", &format!("/{BINARY_PATH}")));
        out.push('\n');
    }
    Ok(out)
}

/// DEBIAN/control. `installed_kib`: the files' sizes, rounded up per file as dpkg-gencontrol does.
/// No `Depends`: the binary needs no shared object. `Recommends: procps`: the unit's
/// `ExecReload=/bin/kill -HUP` is procps's `kill`, which minimal roots and images lack.
pub fn control(cargo_version: &str, installed_kib: u64) -> String {
    format!(
        "Package: gpreempt\n\
         Version: {version}\n\
         Architecture: amd64\n\
         Maintainer: The gpreempt developers <gpreempt@example.invalid>\n\
         Installed-Size: {installed_kib}\n\
         Recommends: procps\n\
         Section: admin\n\
         Priority: optional\n\
         Description: protect latency-critical GPU work from batch work on AMD GPUs\n \
         gpreempt suspends the compute queues of batch (offline) processes while\n \
         latency-critical (online) processes have work on the same AMD GPU, on the\n \
         stock amdgpu driver, through the KFD debug-trap API (Linux 6.5+ or\n \
         amdgpu-dkms). It also shows and traces every process's GPU queues (eBPF on\n \
         the KFD paths of amdgpu) and serves Prometheus metrics as a node agent.\n \
         .\n \
         The binary is static: it needs no shared library, only a Linux kernel.\n",
        version = debian_version(cargo_version),
    )
}

/// Maintainer scripts: systemd learns of the unit (daemon-reload), an enabled agent restarts on
/// upgrade and stops on removal, purge removes an enable link. Nothing enables or starts it.
/// Each does nothing where systemd does not run (a chroot, a container).
pub const POSTINST: &str = "#!/bin/sh
set -e
if [ \"$1\" = configure ] && [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
    if [ -n \"$2\" ]; then
        systemctl try-restart gpreempt-agent.service >/dev/null || true
    fi
fi
";
pub const PRERM: &str = "#!/bin/sh
set -e
if [ \"$1\" = remove ] && [ -d /run/systemd/system ]; then
    systemctl stop gpreempt-agent.service >/dev/null || true
fi
";
pub const POSTRM: &str = "#!/bin/sh
set -e
if [ \"$1\" = purge ]; then
    rm -f /etc/systemd/system/multi-user.target.wants/gpreempt-agent.service
    rmdir --ignore-fail-on-non-empty /etc/gpreempt 2>/dev/null || true
fi
if [ \"$1\" = remove ] && [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
fi
";

/// The copyright file (machine-readable format). The binary links glibc statically (LGPL-2.1+):
/// its terms are met by the complete source of gpreempt, from which the binary can be rebuilt and
/// relinked against another glibc (docs/install.md, "From source").
fn copyright() -> Result<String> {
    let mit = fs::read_to_string(workspace_root().join("LICENSE-MIT")).context("reading LICENSE-MIT")?;
    let mut out = String::from(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
         Upstream-Name: gpreempt\n\
         Comment: /usr/bin/gpreempt is statically linked with the GNU C Library (LGPL-2.1+, see\n \
         /usr/share/common-licenses/LGPL-2.1) and with Rust crates under MIT, Apache-2.0 and\n \
         compatible licenses. The complete source, from which the binary can be rebuilt and\n \
         relinked, is distributed by the gpreempt developers with each release (the project\n \
         has no public address yet); /usr/share/doc/gpreempt/docs/install.md says how to build\n \
         it.\n\
         \n\
         Files: *\n\
         Copyright: The gpreempt developers\n\
         License: MIT or Apache-2.0\n\
         \n\
         License: MIT\n",
    );
    for line in mit.lines().skip_while(|l| !l.starts_with("Permission")) {
        if line.trim().is_empty() {
            out.push_str(" .\n");
        } else {
            let _ = writeln!(out, " {line}");
        }
    }
    out.push_str(
        "\nLicense: Apache-2.0\n \
         On Debian systems, the full text of the Apache License, Version 2.0 is in\n \
         /usr/share/common-licenses/Apache-2.0.\n",
    );
    Ok(out)
}

/// Assemble the package tree in `work`, build `dist/gpreempt_VERSION_amd64.deb`; returns its path.
pub fn build(inputs: &Inputs<'_>, work: &Path, dist: &Path) -> Result<PathBuf> {
    remove_dir(work)?;
    let g = inputs.generated;
    let page_names: Vec<String> = g
        .man_pages
        .iter()
        .map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()).context("a man page without a name"))
        .collect::<Result<_>>()?;
    let docs = doc_files()?;
    let listed = files(&page_names, &docs);
    let put = |relative: &str, content: &[u8], mode: u32| -> Result<()> {
        let path = work.join(relative);
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        fs::write(&path, content).with_context(|| format!("writing {}", path.display()))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    for (relative, mode) in &listed {
        let content = match relative.as_str() {
            BINARY_PATH => fs::read(inputs.binary)?,
            UNIT_PATH => packaged_unit(inputs.unit)?.into_bytes(),
            CONFIG_PATH => inputs.sample.as_bytes().to_vec(),
            "usr/share/doc/gpreempt/copyright" => copyright()?.into_bytes(),
            r if r.starts_with(DOC_DIR) && r.ends_with(".md") => {
                let doc = r.trim_start_matches(DOC_DIR).trim_start_matches('/');
                fs::read(workspace_root().join(doc)).with_context(|| format!("reading {doc}"))?
            }
            r if r.ends_with("/gpreempt") => fs::read(&g.bash)?,
            r if r.ends_with("/_gpreempt") => fs::read(&g.zsh)?,
            r if r.ends_with("/gpreempt.fish") => fs::read(&g.fish)?,
            r if r.starts_with("usr/share/man/man") => {
                let name = Path::new(r).file_name().map(|n| n.to_string_lossy().trim_end_matches(".gz").to_owned());
                let page = g
                    .man_pages
                    .iter()
                    .find(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()) == name)
                    .context("a listed page that was not generated")?;
                // -n: no name or time stamp in the header, so the same page gives the same bytes.
                let mut gzip = Command::new("gzip");
                gzip.args(["-9", "-n", "-c"]).arg(page);
                let out = gzip.output().context("cannot run gzip")?;
                if !out.status.success() {
                    bail!("gzip {} failed ({})", page.display(), out.status);
                }
                out.stdout
            }
            other => bail!("no content for {other}"),
        };
        put(relative, &content, *mode)?;
    }
    // Directories 0755 whatever the umask.
    for (relative, _) in &listed {
        let mut dir = Path::new(relative).parent();
        while let Some(d) = dir.filter(|d| !d.as_os_str().is_empty()) {
            fs::set_permissions(work.join(d), fs::Permissions::from_mode(0o755))?;
            dir = d.parent();
        }
    }

    let installed_kib: u64 = listed
        .iter()
        .map(|(relative, _)| fs::metadata(work.join(relative)).map(|m| m.len().div_ceil(1024)))
        .sum::<std::io::Result<u64>>()?;
    let debian = work.join("DEBIAN");
    fs::create_dir_all(&debian)?;
    put("DEBIAN/control", control(inputs.version, installed_kib).as_bytes(), 0o644)?;
    put("DEBIAN/conffiles", format!("/{CONFIG_PATH}\n").as_bytes(), 0o644)?;
    put("DEBIAN/postinst", POSTINST.as_bytes(), 0o755)?;
    put("DEBIAN/prerm", PRERM.as_bytes(), 0o755)?;
    put("DEBIAN/postrm", POSTRM.as_bytes(), 0o755)?;
    // md5sums of every file but the conffiles (dpkg keeps theirs itself), as dh_md5sums writes it.
    let hashed: Vec<&str> = listed.iter().map(|(r, _)| r.as_str()).filter(|r| *r != CONFIG_PATH).collect();
    let sums = output_in(work, Command::new("md5sum").args(&hashed))?;
    put("DEBIAN/md5sums", sums.as_bytes(), 0o644)?;

    let deb = dist.join(file_name(inputs.version));
    // xz, not dpkg's newer zstd: bullseye's and Ubuntu 20.04's dpkg cannot unpack zstd members.
    run_command(Command::new("dpkg-deb").args(["--build", "--root-owner-group", "-Zxz"]).arg(work).arg(&deb))?;
    print!("{}", output(Command::new("dpkg-deb").arg("--info").arg(&deb))?);
    Ok(deb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_order_as_in_cargo() {
        assert_eq!(debian_version("0.1.0"), "0.1.0");
        assert_eq!(debian_version("1.0.0-rc.1"), "1.0.0~rc.1");
        assert_eq!(file_name("1.0.0-rc.1"), "gpreempt_1.0.0~rc.1_amd64.deb");
    }

    #[test]
    fn the_package_holds_the_binary_pages_completions_unit_and_config() {
        let pages = ["gpreempt.1", "gpreempt-doctor.1", "gpreempt-agent.toml.5"].map(str::to_owned);
        let files = files(&pages, &["README.md".to_owned(), "docs/cli.md".to_owned()]);
        let expected: Vec<(String, u32)> = [
            ("usr/bin/gpreempt", 0o755),
            ("usr/share/man/man1/gpreempt.1.gz", 0o644),
            ("usr/share/man/man1/gpreempt-doctor.1.gz", 0o644),
            ("usr/share/man/man5/gpreempt-agent.toml.5.gz", 0o644),
            ("usr/share/bash-completion/completions/gpreempt", 0o644),
            ("usr/share/zsh/vendor-completions/_gpreempt", 0o644),
            ("usr/share/fish/vendor_completions.d/gpreempt.fish", 0o644),
            ("usr/lib/systemd/system/gpreempt-agent.service", 0o644),
            ("etc/gpreempt/agent.toml", 0o644),
            ("usr/share/doc/gpreempt/copyright", 0o644),
            ("usr/share/doc/gpreempt/README.md", 0o644),
            ("usr/share/doc/gpreempt/docs/cli.md", 0o644),
        ]
        .into_iter()
        .map(|(p, m)| (p.to_owned(), m))
        .collect();
        assert_eq!(files, expected);
    }

    #[test]
    fn the_control_file_has_the_version_and_no_dependency() {
        let control = control("0.1.0", 14321);
        let fields: Vec<&str> = control.lines().filter(|l| !l.starts_with(' ')).collect();
        assert_eq!(
            fields,
            [
                "Package: gpreempt",
                "Version: 0.1.0",
                "Architecture: amd64",
                "Maintainer: The gpreempt developers <gpreempt@example.invalid>",
                "Installed-Size: 14321",
                "Recommends: procps",
                "Section: admin",
                "Priority: optional",
                "Description: protect latency-critical GPU work from batch work on AMD GPUs",
            ]
        );
        // Continuation lines: one leading space, `.` for a blank line, none longer than 80.
        assert!(control.lines().all(|l| l.len() <= 80), "{control}");
        assert!(control.ends_with("\n .\n The binary is static: it needs no shared library, only a Linux kernel.\n"));
    }

    #[test]
    fn no_maintainer_script_enables_or_starts_the_agent() {
        for script in [POSTINST, PRERM, POSTRM] {
            assert!(script.starts_with("#!/bin/sh\nset -e\n"));
            assert!(!script.contains("enable") && !script.contains(" start "), "{script}");
        }
    }

    #[test]
    fn the_sample_config_ships_without_a_live_policy() {
        let sample = "# header\nprocess_grace_s = 60\n\n[[policy]]\nname = \"a\"\n# a comment\nidle = \"2ms\"\n\n\
                      [[policy]]\nname = \"b\"\n";
        assert_eq!(
            comment_out_policies(sample),
            "# header\nprocess_grace_s = 60\n\n\
             # Uncomment to schedule (see `man gpreempt-agent` and `gpreempt schedule --help`):\n\
             # [[policy]]\n# name = \"a\"\n# a comment\n# idle = \"2ms\"\n\n\
             # Uncomment to schedule (see `man gpreempt-agent` and `gpreempt schedule --help`):\n\
             # [[policy]]\n# name = \"b\"\n"
        );
    }

    #[test]
    fn the_project_sample_config_parses_and_has_no_policy_once_packaged() {
        let sample = fs::read_to_string(workspace_root().join("deploy/agent.toml")).unwrap();
        let packaged: toml::Table = comment_out_policies(&sample).parse().unwrap();
        assert!(!packaged.contains_key("policy"), "{packaged:?}");
        // The settings outside the policies stay live.
        let original: toml::Table = sample.parse().unwrap();
        let mut without_policies = original.clone();
        without_policies.remove("policy");
        assert_eq!(packaged, without_policies);
    }

    #[test]
    fn the_packaged_unit_runs_usr_bin_gpreempt() {
        let unit = fs::read_to_string(workspace_root().join("deploy/gpreempt-agent.service")).unwrap();
        let packaged = packaged_unit(&unit).unwrap();
        assert!(!packaged.contains("/usr/local/bin"), "{packaged}");
        assert!(packaged.contains("\nExecStart=/usr/bin/gpreempt agent --config /etc/gpreempt/agent.toml\n"));
        assert!(packaged.contains("\n[Install]\nWantedBy=multi-user.target\n"));
        assert!(packaged_unit("ExecStart=/opt/gpreempt agent\n").is_err());
    }

    /// What the pages and `--help` cite as `docs/…` is in the package, and the readme first.
    #[test]
    fn the_package_carries_the_docs_its_pages_cite() {
        let docs = doc_files().unwrap();
        assert_eq!(docs[0], "README.md");
        for cited in
            ["docs/cli.md", "docs/evaluate.md", "docs/install.md", "docs/guide/agent.md", "docs/guide/kubernetes.md"]
        {
            assert!(docs.iter().any(|d| d == cited), "{cited} not in {docs:?}");
        }
        let copyright = copyright().unwrap();
        assert!(!copyright.contains("example.invalid"), "{copyright}");
        assert!(!control("0.1.0", 1).contains("example.invalid/"), "a homepage that is no address");
    }
}
