"""Validate rendered Kubernetes manifests offline (`cargo xtask manifests` runs this).

    python3 validate.py --schemas DIR --kubernetes 1.29 --kubernetes latest RENDERED.yaml...

Every object of every file is checked:
- a built-in kind against the OpenAPI schema of each Kubernetes release given (the package
  kubernetes-validate carries them), strictly: a field the release does not know is an error, as
  the API server's strict field validation (kubectl's default since 1.27) makes it;
- a monitoring.coreos.com/v1 kind (ServiceMonitor, PodMonitor) against the JSON Schema of DIR
  (deploy/kubernetes/schemas/README.md says where they come from);
- a few rules of the API server's own validation that no schema states (`api_rules`).
A kind with no schema is an error, not a skip. One line per failure, naming the file, the object
and the Kubernetes release; the last line is `N objects, M checks: K failed`; exit status 1 when
anything failed, 2 when the tools are missing.
"""

import argparse
import json
import pathlib
import sys

try:
    import jsonschema
    import kubernetes_validate
    import kubernetes_validate.utils
    import yaml
except ImportError as e:
    print(f"validate.py: {e}: run `cargo xtask setup` (installs kubernetes-validate)", file=sys.stderr)
    sys.exit(2)

# The kinds validated against DIR's schemas: (apiVersion, kind) -> file name.
CUSTOM = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-monitoring-v1.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor-monitoring-v1.json",
}


def name_of(obj):
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    name = meta.get("name", "<no name>")
    return f"{obj.get('kind', '<no kind>')}/{namespace}/{name}" if namespace else f"{obj.get('kind', '<no kind>')}/{name}"


def containers(obj):
    """The containers of a workload's pod template (or of a Pod)."""
    spec = obj.get("spec") or {}
    pod = spec if obj.get("kind") == "Pod" else ((spec.get("template") or {}).get("spec") or {})
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for c in pod.get(key) or []:
            yield key, c


def api_rules(obj):
    """Refusals of the API server that the OpenAPI schemas cannot state
    (k8s.io/kubernetes pkg/apis/core/validation)."""
    errors = []
    if not (obj.get("metadata") or {}).get("name"):
        errors.append("metadata.name: required")
    for key, c in containers(obj):
        sc = c.get("securityContext") or {}
        # ValidateSecurityContext: "cannot set `allowPrivilegeEscalation` to false and `privileged` to true".
        if sc.get("privileged") is True and sc.get("allowPrivilegeEscalation") is False:
            errors.append(
                f"spec.template.spec.{key}[{c.get('name')}].securityContext: "
                "cannot set `allowPrivilegeEscalation` to false and `privileged` to true"
            )
        # ...and the same for CAP_SYS_ADMIN.
        added = (sc.get("capabilities") or {}).get("add") or []
        if sc.get("allowPrivilegeEscalation") is False and any(a in ("SYS_ADMIN", "CAP_SYS_ADMIN") for a in added):
            errors.append(
                f"spec.template.spec.{key}[{c.get('name')}].securityContext: "
                "cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` CAP_SYS_ADMIN"
            )
    return errors


def schema_errors(validator, obj):
    return [
        f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    ]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--schemas", required=True, type=pathlib.Path)
    parser.add_argument("--kubernetes", action="append", required=True, help="a release, e.g. 1.29, or `latest`")
    parser.add_argument("files", nargs="+", type=pathlib.Path)
    args = parser.parse_args()

    latest = kubernetes_validate.utils.latest_version()
    releases = []
    for r in args.kubernetes:
        r = kubernetes_validate.utils.major_minor(latest if r == "latest" else r)
        if r not in (kubernetes_validate.utils.major_minor(v) for v in kubernetes_validate.utils.all_versions()):
            print(f"validate.py: kubernetes-validate {kubernetes_validate.__version__} has no schemas of Kubernetes {r}")
            return 2
        if r not in releases:
            releases.append(r)
    custom = {
        key: jsonschema.Draft202012Validator(json.loads((args.schemas / file).read_text()))
        for key, file in CUSTOM.items()
    }

    objects = checks = failed = 0
    for path in args.files:
        for obj in yaml.safe_load_all(path.read_text()):
            if not obj:
                continue
            objects += 1
            name = name_of(obj)
            problems = [("", e) for e in api_rules(obj)]
            checks += 1
            key = (obj.get("apiVersion"), obj.get("kind"))
            if key in custom:
                checks += 1
                problems += [(f" ({CUSTOM[key]})", e) for e in schema_errors(custom[key], obj)]
            else:
                for release in releases:
                    checks += 1
                    try:
                        kubernetes_validate.validate(obj, release, strict=True)
                    except kubernetes_validate.utils.ValidationError as e:
                        where = ".".join(str(p) for p in e.path) or "<root>"
                        problems.append((f" (Kubernetes {release})", f"{where}: {e.message}"))
                    except kubernetes_validate.utils.SchemaNotFoundError as e:
                        problems.append((f" (Kubernetes {release})", f"no schema: {e.message}"))
            for against, problem in problems:
                failed += 1
                print(f"FAIL {path.name}: {name}{against}: {problem}")
    print(
        f"{objects} objects, {checks} checks (Kubernetes {', '.join(releases)}; "
        f"kubernetes-validate {kubernetes_validate.__version__}): {failed} failed"
    )
    return 1 if failed or objects == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
