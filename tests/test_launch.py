"""`tierlocal plan MODEL --emit skypilot|lws`: launch specs for a cluster, read back as the
launchers read them. The structure here (fast path: parallel sizes from the recipes, nodes,
ranks, probes, volumes, refusals); the launchers' own validators (SkyPilot's task schema and
``sky.Task``, the LWS CRD's openAPIV3Schema, kubernetes-validate) in the tests marked engines,
which use the copies tests/assets/prepare.py installs apart from tierlocal."""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml

from tests.support.assets import Assets
from tests.support.cli import REPO_ROOT, run_cli

pytestmark = pytest.mark.xdist_group("launch")  # one worker: the CLI runs and validator processes are shared (Verdicts)

#: The topologies the issue names: (--gpu, --nodes or None for the plan's own, nodes, GPUs).
TOPOLOGIES = [("H200", None, 2, 16), ("H100", "4", 4, 32), ("B300", None, 1, 8)]
CASES = [(emit, engine, *topology) for emit in ("skypilot", "lws") for engine in ("vllm", "sglang") for topology in TOPOLOGIES]
IDS = [f"{emit}-{engine}-{gpu}" for emit, engine, gpu, *_ in CASES]


def emit(*args: str) -> object:
    """`plan kimi-k3 ARGS --json`, parsed (a copy: the same arguments run the CLI once per worker)."""
    return copy.deepcopy(_emitted(args))


@functools.cache
def _emitted(args: tuple[str, ...]) -> object:
    result = run_cli("plan", "kimi-k3", *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _args(kind: str, engine: str, gpu: str, nodes: str | None) -> list[str]:
    return ["--emit", kind, "--engine", engine, "--gpu", gpu, *(["--nodes", nodes] if nodes else [])]


def _commands(script: str) -> list[list[str]]:
    """The engine commands a node script runs (each ``exec …`` line), as argv."""
    return [shlex.split(line.strip().removeprefix("exec ")) for line in script.splitlines() if line.strip().startswith("exec ")]


def _value(argv: list[str], flag: str, default: str = "1") -> str:
    return argv[argv.index(flag) + 1] if flag in argv else default


def _gpus_used(argv: list[str]) -> int:
    """The GPUs a command's parallel sizes cover: tensor × pipeline × data (vLLM); SGLang's
    --tp-size is the GPU count (data-parallel attention splits inside it)."""
    if argv[0] == "sglang":
        return int(_value(argv, "--tp-size"))
    return int(_value(argv, "--tensor-parallel-size")) * int(_value(argv, "--pipeline-parallel-size")) * int(_value(argv, "--data-parallel-size"))


def _check_engine_commands(engine: str, head: list[str], worker: list[str], nodes: int, gpus: int, experts: int = 896) -> None:
    assert _gpus_used(head) == _gpus_used(worker) == gpus
    if engine == "vllm":
        assert "--enable-prefix-caching" in head and "--enable-prefix-caching" in worker  # off by default for K3
    else:
        assert "--disable-radix-cache" not in head + worker  # SGLang's prefix cache is on unless disabled
        assert experts % int(_value(head, "--ep-size")) == 0
    if nodes > 1:
        rendezvous = "--master-addr" if engine == "vllm" else "--dist-init-addr"
        assert _value(head, "--nnodes") == _value(worker, "--nnodes") == str(nodes)
        assert _value(head, "--node-rank") == "0" and _value(worker, "--node-rank") == "${RANK}"
        assert _value(head, rendezvous).startswith("${HEAD}") and _value(worker, rendezvous).startswith("${HEAD}")
        if engine == "vllm":
            assert "--headless" in worker and "--headless" not in head  # only the head serves HTTP
    assert _value(head, "--port") == "8000"


@pytest.mark.parametrize(("kind", "engine", "gpu", "nodes_arg", "nodes", "gpus"), CASES, ids=IDS)
def test_specs_for_the_published_topologies(kind: str, engine: str, gpu: str, nodes_arg: str | None, nodes: int, gpus: int) -> None:
    spec = emit(*_args(kind, engine, gpu, nodes_arg))
    if kind == "skypilot":
        assert isinstance(spec, dict)
        assert spec["num_nodes"] == nodes and spec["resources"]["accelerators"] == f"{gpu}:8"
        assert spec["resources"]["disk_size"] >= 1560  # the 1.56 TB repo fits the node's disk
        assert spec["service"]["readiness_probe"]["path"] == "/v1/models" and spec["resources"]["ports"] == [8000]
        mount = spec["file_mounts"]["/weights"]
        assert mount["persistent"] is True and mount["mode"] == "MOUNT_CACHED"  # a bucket that outlives the instance
        assert "SKYPILOT_NODE_IPS" in spec["run"] and "SKYPILOT_NODE_RANK" in spec["run"]
        head, worker = _commands(spec["run"])
        pinned = "vllm==0.27.1" in spec["setup"] if engine == "vllm" else spec["resources"]["image_id"] == "docker:lmsysorg/sglang:kimi-k3"
        assert pinned
        assert spec["secrets"] == {"HF_TOKEN": None}  # the token is never written into the spec
    else:
        assert isinstance(spec, dict) and spec["kind"] == "List"
        claim, lws, service = spec["items"]
        assert (claim["kind"], lws["kind"], service["kind"]) == ("PersistentVolumeClaim", "LeaderWorkerSet", "Service")
        template = lws["spec"]["leaderWorkerTemplate"]
        assert template["size"] == nodes and template["restartPolicy"] == "RecreateGroupOnPodRestart"
        leader, worker_pod = template["leaderTemplate"]["spec"], template["workerTemplate"]["spec"]
        for pod in (leader, worker_pod):
            (container,) = pod["containers"]
            assert container["resources"]["limits"] == {"nvidia.com/gpu": 8}
            volumes = {volume["name"]: volume for volume in pod["volumes"]}
            assert (
                volumes["dshm"]["emptyDir"]["medium"] == "Memory"
                and volumes["weights"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
            )
        assert leader["containers"][0]["readinessProbe"]["httpGet"] == {"path": "/v1/models", "port": 8000}
        leader_script, worker_script = leader["containers"][0]["command"][2], worker_pod["containers"][0]["command"][2]
        assert "HEAD=${LWS_LEADER_ADDRESS}" in leader_script and "RANK=${LWS_WORKER_INDEX}" in worker_script
        (head,), (worker,) = _commands(leader_script), _commands(worker_script)
        assert service["spec"]["selector"] == {"leaderworkerset.sigs.k8s.io/name": lws["metadata"]["name"], "role": "leader"}
        image = leader["containers"][0]["image"]
        assert image == ("vllm/vllm-openai:v0.27.1" if engine == "vllm" else "lmsysorg/sglang:kimi-k3")
    _check_engine_commands(engine, head, worker, nodes, gpus)


def test_h200_follows_the_recipes() -> None:
    """16 × H200: vLLM as the docs' multi-node example (TP 8 in a node, PP 2 across, Hopper
    flags from the recipe), SGLang as the cookbook's H200 2×8 cell (--tp-size 16 --ep-size 16)."""
    vllm = emit("--emit", "skypilot", "--gpu", "H200")
    head, _worker = _commands(vllm["run"])  # type: ignore[index]
    assert (_value(head, "--tensor-parallel-size"), _value(head, "--pipeline-parallel-size")) == ("8", "2")
    assert _value(head, "--moe-backend") == "marlin" and _value(head, "--max-model-len") == "32768"
    assert _value(head, "--gpu-memory-utilization") == "0.90"  # the multi-node strategy's value replaces the base 0.95
    assert head.count("--gpu-memory-utilization") == 1
    sglang = emit("--emit", "skypilot", "--engine", "sglang", "--gpu", "H200")
    head, _worker = _commands(sglang["run"])  # type: ignore[index]
    assert (_value(head, "--tp-size"), _value(head, "--ep-size"), _value(head, "--dist-init-addr")) == ("16", "16", "${HEAD}:20000")
    assert _value(head, "--moe-runner-backend") == "marlin"


def test_b300_single_node_has_no_rendezvous_and_the_blackwell_flags() -> None:
    spec = emit("--emit", "skypilot", "--gpu", "B300")
    head, worker = _commands(spec["run"])  # type: ignore[index]
    assert head == worker and "--nnodes" not in head and "network_tier" not in spec["resources"]  # type: ignore[index]
    assert (_value(head, "--kv-cache-dtype"), _value(head, "--max-model-len")) == ("fp8", "1048576")


def test_the_expert_layout_picks_the_all_to_all_backend_by_interconnect() -> None:
    rdma = emit("--emit", "skypilot", "--gpu", "B200", "--nodes", "2", "--layout", "expert")
    head, worker = _commands(rdma["run"])  # type: ignore[index]
    assert (_value(head, "--data-parallel-size"), _value(head, "--data-parallel-size-local")) == ("16", "8")
    assert _value(head, "--all2all-backend") == "deepep_v2" and "--enable-expert-parallel" in head
    assert _value(worker, "--data-parallel-start-rank") == "$((RANK*8))" and "--headless" in worker
    assert rdma["envs"]["UCX_TLS"] == "rc,cuda_copy"  # type: ignore[index]
    nvlink = emit("--emit", "skypilot", "--gpu", "B300", "--layout", "expert")
    head, _worker = _commands(nvlink["run"])  # type: ignore[index]
    assert _value(head, "--all2all-backend") == "flashinfer_nvlink_one_sided"


def test_the_header_names_the_gateway_target_the_cluster_is() -> None:
    """The YAML's header gives the cluster as a tier-1 gateway target the gateway's own config
    accepts: the model id the engine serves (--served-model-name), its cost at the plan's rate."""
    import tomllib

    from tierlocal.gateway.config import parse_config

    text = run_cli("plan", "kimi-k3", "--emit", "lws", "--gpu", "H200", "--rate", "3.5").stdout
    line = next(line for line in text.splitlines() if line.startswith("# as the gateway's tier-1 target: "))
    inline = line.removeprefix("# as the gateway's tier-1 target: ").split(" (", 1)[0]
    config = tomllib.loads(f'[[routes]]\nmodel = "kimi-k3"\ntargets = [ {inline} ]\n')
    (target,) = parse_config(config, "header").routes[0].targets
    assert (target.url, target.model, target.tier, target.usd_per_hour) == ("http://kimi-k3-vllm:8000/v1", "moonshotai/Kimi-K3", 1, 16 * 3.5)
    head, worker = (_commands(script)[0] for script in re.findall(r"- \|\n((?:            .*\n)+)", text) if "exec " in script)
    assert _value(head, "--served-model-name") == _value(worker, "--served-model-name") == "moonshotai/Kimi-K3"


def test_mi355x_gets_the_rocm_images_and_amd_gpus() -> None:
    """8 × MI355X (the ROCm recipe): AMD's GPU resource, the ROCm images, the vision encoder
    data-parallel (--mm-encoder-tp-mode data), AITER switched on."""
    lws = emit("--emit", "lws", "--gpu", "MI355X")
    leader = lws["items"][1]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]  # type: ignore[index]
    assert leader["resources"]["limits"] == {"amd.com/gpu": 8} and leader["image"] == "vllm/vllm-openai-rocm:kimi-k3"
    (head,) = _commands(leader["command"][2])
    assert _value(head, "--mm-encoder-tp-mode") == "data" and {"name": "VLLM_ROCM_USE_AITER", "value": "1"} in leader["env"]
    sky = emit("--emit", "skypilot", "--engine", "sglang", "--gpu", "MI355X")
    assert sky["resources"]["image_id"] == "docker:lmsysorg/sglang-rocm:rocm720-mi35x-k3-20260727"  # type: ignore[index]


def test_gb300_nodes_in_one_nvlink_domain_use_the_nvlink_backends() -> None:
    """GB300 trays of 4 in one NVL72 rack: expert parallel over NVLink even across nodes, with
    DeepGEMM MegaMoE (the recipe: not over RDMA)."""
    spec = emit("--emit", "skypilot", "--gpu", "GB300", "--gpus-per-node", "4", "--nodes", "2", "--layout", "expert")
    head, worker = _commands(spec["run"])  # type: ignore[index]
    assert spec["resources"]["accelerators"] == "GB300:4" and spec["num_nodes"] == 2  # type: ignore[index]
    assert _value(head, "--all2all-backend") == "flashinfer_nvlink_one_sided" and _value(head, "--moe-backend") == "deep_gemm_mega_moe"
    assert _value(worker, "--data-parallel-start-rank") == "$((RANK*4))"


def test_yaml_is_the_same_spec_as_json() -> None:
    as_yaml = run_cli("plan", "kimi-k3", "--emit", "lws", "--gpu", "H200")
    assert as_yaml.returncode == 0, as_yaml.stderr
    assert as_yaml.stdout.startswith("# Kimi K3 on 2 × 8 H200 with vllm")
    assert list(yaml.safe_load_all(as_yaml.stdout)) == emit("--emit", "lws", "--gpu", "H200")["items"]  # type: ignore[index]
    sky = run_cli("plan", "kimi-k3", "--emit", "skypilot", "--gpu", "H200")
    assert "run: |\n" in sky.stdout and yaml.safe_load(sky.stdout) == emit("--emit", "skypilot", "--gpu", "H200")


@pytest.mark.parametrize(
    ("args", "message", "hint"),
    [
        (["--gpu", "H100", "--nodes", "2"], "16 × H100 hold 1,280 GB, below the 1,680 GB this model needs to serve", "3 nodes of 8 × H100 clear it"),
        (["--gpu", "H200", "--gpus-per-node", "5", "--nodes", "3"], "5-way tensor parallelism does not divide the model's 96 attention heads", ""),
        (
            ["--gpu", "H100", "--engine", "sglang", "--nodes", "3"],
            "24-way expert parallelism does not divide the model's 896 routed experts",
            "4 nodes of 8 (32 GPUs) divide evenly",
        ),
        (["--gpu", "A100 80GB"], "the published vllm recipe for this model covers no A100 80GB", "it covers: B200, B300, GB300, H100, H200, MI355X"),
        (
            ["--gpu", "H200", "--layout", "expert"],
            "the vllm recipe marks the expert-parallel layout unsupported on H200",
            "use the tensor layout there",
        ),
    ],
)
def test_a_topology_that_cannot_work_is_refused_in_one_line(args: list[str], message: str, hint: str) -> None:
    result = run_cli("plan", "kimi-k3", "--emit", "skypilot", *args)
    assert result.returncode == 2 and result.stdout == ""
    error, *rest = result.stderr.strip().splitlines()
    assert message in error and len(rest) <= 1
    assert hint in "".join(rest)


def test_the_default_cluster_is_one_the_engine_can_split_the_model_over() -> None:
    """3 × 8 H100 hold Kimi K3, but sglang's 24-way expert parallelism cannot split its 896
    experts: without --nodes the spec is for the fewest nodes that can (4 × 8), not a refusal."""
    spec = emit("--emit", "skypilot", "--engine", "sglang", "--gpu", "H100")
    assert spec["num_nodes"] == 4  # type: ignore[index]
    launch = emit("--gpu", "H100")["launch"]  # type: ignore[index]
    assert _value(launch["sglang"], "--ep-size") == "32" and _value(launch["sglang"], "--nnodes") == "4"
    assert _value(launch["vllm"], "--nnodes") == "3"  # vllm's tensor × pipeline layout needs no such split


def test_the_plan_report_shows_both_nodes_commands_and_points_to_emit() -> None:
    payload = emit("--gpu", "H200")
    launch = payload["launch"]  # type: ignore[index]
    assert set(launch) == {"vllm", "vllm (other nodes)", "sglang", "sglang (other nodes)"}
    assert _value(launch["vllm (other nodes)"], "--node-rank") == "1" and "--headless" in launch["vllm (other nodes)"]
    report = run_cli("plan", "kimi-k3", "--gpu", "H100")
    assert "As a launch spec for every node: tierlocal plan kimi-k3 --emit skypilot|lws" in report.stdout
    assert "Not launched as planned" not in report.stdout and "--nnodes 4" in report.stdout.replace("\n", " ")  # sglang on 4 × 8


# --- the launchers' own validators ---------------------------------------------------------


def _validate_all(assets: Assets, kind: str, specs: list[object]) -> list[dict[str, object]]:
    """The launcher's verdict on each spec, from one validator process for them all."""
    result = subprocess.run(
        [sys.executable, "-S", str(REPO_ROOT / "tests" / "support" / "launch_validate.py"), kind],
        input=json.dumps(specs),
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(assets.launch_validators), "HOME": os.environ.get("HOME", "/tmp")},
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    verdicts = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(verdicts) == len(specs)
    return verdicts  # type: ignore[no-any-return]


class Verdicts:
    """Every spec the validator tests below hand the launchers, validated once per kind the
    first time one is asked for (SkyPilot's import alone takes seconds: one process per spec
    was 31 of them). The tests are one xdist group, so one worker validates them all."""

    def __init__(self, assets: Assets) -> None:
        self._assets = assets
        self._cache: dict[str, dict[str, dict[str, object]]] = {}

    def __call__(self, kind: str, spec: object) -> dict[str, object]:
        if kind not in self._cache:
            specs = _specs_to_validate(kind)
            verdicts = _validate_all(self._assets, kind, specs)
            self._cache[kind] = {_key(spec): verdict for spec, verdict in zip(specs, verdicts, strict=True)}
        return self._cache[kind][_key(spec)]


def _key(spec: object) -> str:
    return json.dumps(spec, sort_keys=True)


def _specs_to_validate(kind: str) -> list[object]:
    """What the tests below validate of ``kind``: every topology, the other families, and each
    broken copy."""
    specs: list[object] = [emit(*_args(kind, engine, gpu, nodes)) for k, engine, gpu, nodes, *_ in CASES if k == kind]
    specs += [emit("--emit", kind, "--engine", engine, *args) for engine in ("vllm", "sglang") for args in MORE]
    broken = _broken_skypilot if kind == "skypilot" else _broken_lws
    specs += [spec for _, spec in broken(emit("--emit", kind, "--gpu", "H200"))]  # type: ignore[arg-type]
    return specs


@pytest.fixture(scope="session")  # not module: a worker's run of the module's tests is interleaved with others'
def validated(assets: Assets) -> Verdicts:
    return Verdicts(assets)


def test_the_module_is_one_group_on_one_worker(request: pytest.FixtureRequest) -> None:
    """Under xdist's ``--dist loadgroup`` (the suite's addopts) a test of a group carries
    ``@group`` in its node ID, and that is how xdist sends the group to one worker. On pytest
    9.2 the mark silently stopped grouping (pytest-dev/pytest-xdist#1386): every worker then
    validated every spec again. Without xdist (``-n 0``) there is one worker and no group."""
    if request.config.getoption("loadgroup", default=False):  # set on a worker of --dist loadgroup
        assert request.node.nodeid.endswith("@launch")


#: Beyond the issue's three: the ROCm recipe, and GB300 trays of 4 with expert parallel over NVLink.
MORE = [["--gpu", "MI355X"], ["--gpu", "GB300", "--gpus-per-node", "4", "--nodes", "2", "--layout", "expert"]]


@pytest.mark.parametrize("args", MORE, ids=["mi355x", "gb300-expert"])
@pytest.mark.parametrize("kind", ["skypilot", "lws"])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_launchers_accept_the_other_families(validated: Verdicts, kind: str, engine: str, args: list[str]) -> None:
    assert validated(kind, emit("--emit", kind, "--engine", engine, *args)) == {"ok": True, "errors": []}


@pytest.mark.parametrize(("kind", "engine", "gpu", "nodes_arg", "nodes", "gpus"), CASES, ids=IDS)
def test_the_launchers_accept_every_spec(validated: Verdicts, kind: str, engine: str, gpu: str, nodes_arg: str | None, nodes: int, gpus: int) -> None:
    verdict = validated(kind, emit(*_args(kind, engine, gpu, nodes_arg)))
    assert verdict == {"ok": True, "errors": []}


def _broken_skypilot(spec: dict) -> list[tuple[str, dict]]:  # type: ignore[type-arg]
    """(what the refusal must say, the spec broken that way)."""
    cases = []
    for name, edit in [
        ("$.num_nodes", lambda s: s.update(num_nodes="two")),
        ("unsupported field 'replicas'", lambda s: s.update(replicas=1)),
        ("'path' is a required property", lambda s: s["service"]["readiness_probe"].pop("path")),
        ("$.accelerators", lambda s: s["resources"].update(accelerators=8)),
        ("'STREAM' is not one of", lambda s: s["file_mounts"]["/weights"].update(mode="STREAM")),
    ]:
        broken = copy.deepcopy(spec)
        edit(broken)
        cases.append((name, broken))
    return cases


def _broken_lws(spec: dict) -> list[tuple[str, dict]]:  # type: ignore[type-arg]
    cases = []
    for name, edit in [
        ("leaderWorkerTemplate.size: 'two' is not of type 'integer'", lambda items: items[1]["spec"]["leaderWorkerTemplate"].update(size="two")),
        ("restartPolicy: 'Always' is not one of", lambda items: items[1]["spec"]["leaderWorkerTemplate"].update(restartPolicy="Always")),
        ("'workerTemplate' is a required property", lambda items: items[1]["spec"]["leaderWorkerTemplate"].pop("workerTemplate")),
        (
            "leaderTemplate.spec.containerz: unknown field",
            lambda items: items[1]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"].update(containerz=[]),
        ),
        ("Service: 'eighty' is not of type 'integer'", lambda items: items[2]["spec"]["ports"][0].update(port="eighty")),
        (
            "PersistentVolumeClaim: Additional properties are not allowed ('accessMode'",
            lambda items: items[0]["spec"].update(accessMode=["ReadWriteMany"]),
        ),
    ]:
        broken = copy.deepcopy(spec)
        edit(broken["items"])
        cases.append((name, broken))
    return cases


@pytest.mark.parametrize("index", range(5))
def test_a_task_broken_on_purpose_is_refused_by_skypilot(validated: Verdicts, index: int) -> None:
    expected, broken = _broken_skypilot(emit("--emit", "skypilot", "--gpu", "H200"))[index]  # type: ignore[arg-type]
    verdict = validated("skypilot", broken)
    assert verdict["ok"] is False and expected in " ".join(verdict["errors"]), (expected, verdict)  # type: ignore[arg-type]


@pytest.mark.parametrize("index", range(6))
def test_kubernetes_objects_broken_on_purpose_are_refused_by_the_crd_and_kubernetes_validate(validated: Verdicts, index: int) -> None:
    expected, broken = _broken_lws(emit("--emit", "lws", "--gpu", "H200"))[index]  # type: ignore[arg-type]
    verdict = validated("lws", broken)
    assert verdict["ok"] is False and expected in " ".join(verdict["errors"]), (expected, verdict)  # type: ignore[arg-type]


def test_a_malformed_launch_table_is_a_one_line_catalog_error() -> None:
    from dataclasses import replace

    from tierlocal.catalog import find_frontier
    from tierlocal.errors import CatalogError
    from tierlocal.tiers.facts import _launch_recipe

    model = find_frontier("kimi-k3")
    assert model is not None
    broken = replace(model, launch={"vllm": {"family": {"hopper": {"flags": []}}}})  # a family without its GPUs
    with pytest.raises(CatalogError, match=r"kimi-k3's \[model.launch\] is malformed"):
        _launch_recipe(broken)
