"""Validate launch specs with the launchers' own code, apart from tierlocal: run as
``python -S tests/support/launch_validate.py KIND < specs.json`` with PYTHONPATH naming the
folder tests/assets/prepare.py installed SkyPilot and kubernetes-validate into. Reads a JSON
list of specs (one interpreter for them all: importing SkyPilot takes seconds) and prints a JSON
list of verdicts in the same order, each ``{"ok": bool, "errors": [...]}``.

- ``skypilot``: SkyPilot's task schema (``sky.utils.schemas.get_task_schema``), then
  ``sky.Task.from_yaml_config``, which validates resources, storage and the service block and
  builds the task as ``sky launch`` would — no cloud account needed.
- ``lws``: each object by kind: a LeaderWorkerSet against the ``openAPIV3Schema`` of the LWS
  CRD vendored in tests/fixtures/lws (kubernetes-sigs/lws v0.10.0), with unknown fields refused
  as ``kubectl apply --validate=strict`` refuses them; the core kinds (PersistentVolumeClaim,
  Service) with kubernetes-validate's schemas for Kubernetes 1.33, strict.
"""

from __future__ import annotations

import copy
import functools
import json
import sys
from pathlib import Path

CRD = Path(__file__).resolve().parents[1] / "fixtures" / "lws" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml"
KUBERNETES_VERSION = "1.33"


def validate_skypilot(task: dict) -> list[str]:  # type: ignore[type-arg]
    import sky
    from sky.utils import common_utils, schemas

    try:
        common_utils.validate_schema(task, schemas.get_task_schema(), "Invalid task YAML: ")
        sky.Task.from_yaml_config(task)
    except Exception as error:  # any refusal is the answer
        return [f"{type(error).__name__}: {error}"]
    return []


def _unknown_fields(value: object, schema: dict, where: str) -> list[str]:  # type: ignore[type-arg]
    """Fields the schema does not declare (where it declares its properties and does not keep unknown ones)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found: list[str] = []
    if isinstance(value, dict):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if properties is not None and key in properties:
                found += _unknown_fields(item, properties[key], f"{where}.{key}")
            elif isinstance(extra, dict):
                found += _unknown_fields(item, extra, f"{where}.{key}")
            elif properties is not None:
                found.append(f"{where}.{key}: unknown field")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            found += _unknown_fields(item, schema["items"], f"{where}[{index}]")
    return found


@functools.cache
def _crd() -> dict:  # type: ignore[type-arg]
    """The LWS CRD, parsed once per process (with libyaml where PyYAML has it: the pure-Python
    parser took a second for it, per spec)."""
    import yaml

    return yaml.load(CRD.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # type: ignore[no-any-return]


def validate_lws(documents: list[dict]) -> list[str]:  # type: ignore[type-arg]
    import jsonschema
    import kubernetes_validate

    crd = _crd()
    version = crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    errors: list[str] = []
    for document in documents:
        kind = document.get("kind")
        if kind == "LeaderWorkerSet":
            if document.get("apiVersion") != f"{crd['spec']['group']}/{version['name']}":
                errors.append(f"LeaderWorkerSet: apiVersion {document.get('apiVersion')!r} is not the CRD's")
            body = {key: value for key, value in document.items() if key not in ("apiVersion", "kind", "metadata")}
            errors += [f"LeaderWorkerSet: {error.json_path}: {error.message}" for error in jsonschema.Draft7Validator(schema).iter_errors(body)]
            errors += [f"LeaderWorkerSet: {problem}" for problem in _unknown_fields(body, schema, "$")]
            continue
        try:
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            errors.append(f"{kind}: {error.message} at {'.'.join(str(part) for part in error.path)}")
        except Exception as error:  # an unknown kind, a version without schemas
            errors.append(f"{kind}: {type(error).__name__}: {error}")
    return errors


def verdict(kind: str, spec: dict) -> dict[str, object]:  # type: ignore[type-arg]
    if kind == "skypilot":
        errors = validate_skypilot(copy.deepcopy(spec))  # sky may fill in what it reads
    else:
        errors = validate_lws(spec["items"] if spec.get("kind") == "List" else [spec])
    return {"ok": not errors, "errors": errors}


def main() -> None:
    kind = sys.argv[1]
    print(json.dumps([verdict(kind, spec) for spec in json.load(sys.stdin)]))


if __name__ == "__main__":
    main()
