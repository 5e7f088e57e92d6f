"""Write the JSON Schemas of ServiceMonitor and PodMonitor (monitoring.coreos.com/v1) that
`cargo xtask manifests` validates the overlays' objects against (README.md says where they come
from). Run with the package installed, e.g. in a throw-away virtualenv:

    python3 -m venv /tmp/po && /tmp/po/bin/pip install cloudcoil.models.prometheus_operator==0.80.1.0
    /tmp/po/bin/python deploy/kubernetes/schemas/generate.py
"""

import json
import pathlib

from cloudcoil.models.prometheus_operator import v1

HERE = pathlib.Path(__file__).resolve().parent


def strict(node):
    """Every object schema with declared properties refuses other keys, as the API server's strict
    field validation (kubectl's default since 1.27) refuses fields a CRD's schema does not declare;
    pydantic's "title" (its own names for the fields) goes."""
    if isinstance(node, dict):
        if isinstance(node.get("title"), str):
            del node["title"]
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            strict(value)
    elif isinstance(node, list):
        for value in node:
            strict(value)
    return node


for kind in ("ServiceMonitor", "PodMonitor"):
    schema = strict(getattr(v1, kind).model_json_schema(by_alias=True, mode="validation"))
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["description"] = f"{kind} (monitoring.coreos.com/v1), Prometheus operator v0.80.1"
    out = HERE / f"{kind.lower()}-monitoring-v1.json"
    out.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
    print(f"{out.name}: {len(schema['$defs'])} definitions")
