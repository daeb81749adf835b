"""Launch specs for a :class:`~tierlocal.tiers.launch.Topology`, as the launchers read them:
a SkyPilot task (``sky launch`` / ``sky serve``) and a Kubernetes LeaderWorkerSet with the
volume claim for the weights and the Service in front of the leader. Plain dicts (YAML or JSON
at the CLI). Pure. Sizes in bytes, times in seconds."""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

from .launch import LaunchRecipe, Topology, node_command, shell_line

__all__ = ["LaunchTarget", "skypilot_task", "leaderworkerset"]

#: Where the weights are mounted on every node, and the file that says they are complete.
WEIGHTS_MOUNT = "/weights"
_COMPLETE = ".tierlocal-complete"
#: /dev/shm for the engines' inter-process tensors (the LWS examples mount one in memory).
SHM_SIZE = "64Gi"


@dataclass(frozen=True)
class LaunchTarget:
    """What to launch: ``name`` names the cluster, service and volume; ``weights_bytes`` is
    the repo as shipped, ``disk_bytes`` the local disk to plan per node; ``volume`` the bucket
    (SkyPilot) or PersistentVolumeClaim (Kubernetes) that keeps the weights between launches."""

    name: str
    hf_repo: str
    weights_bytes: int
    disk_bytes: int
    port: int
    volume: str

    @property
    def weights_dir(self) -> str:
        return f"{WEIGHTS_MOUNT}/{self.hf_repo.rsplit('/', 1)[-1]}"


def _accelerator_vendor(top: Topology) -> str:
    return "amd" if top.family == "amd" else "nvidia"


def _image(top: Topology, recipe: LaunchRecipe) -> str | None:
    engine = recipe.engines[top.engine]
    return engine.image_amd if _accelerator_vendor(top) == "amd" and engine.image_amd else engine.image


def _download(target: LaunchTarget) -> str:
    """Fetch the weights into the volume once (a marker file says they are complete)."""
    done = f"{target.weights_dir}/{_COMPLETE}"
    return (
        f"if [ ! -f {done} ]; then\n"
        "  python3 -m pip install --quiet 'huggingface_hub>=1.0'\n"
        f"  hf download {shlex.quote(target.hf_repo)} --local-dir {target.weights_dir} && touch {done}\n"
        "fi\n"
    )


def _wait_for_weights(target: LaunchTarget) -> str:
    return f"until [ -f {target.weights_dir}/{_COMPLETE} ]; do echo 'waiting for the weights in {target.weights_dir}'; sleep 30; done\n"


def _start(top: Topology, recipe: LaunchRecipe, target: LaunchTarget) -> tuple[str, str, dict[str, str]]:
    """(head line, worker line, environment) for every node."""
    head = node_command(top, recipe, "head", model_path=target.weights_dir, port=target.port, served_name=target.hf_repo)
    worker = node_command(top, recipe, "worker", model_path=target.weights_dir, port=target.port, served_name=target.hf_repo)
    return shell_line(head.argv), shell_line(worker.argv), head.env


def skypilot_task(top: Topology, recipe: LaunchRecipe, target: LaunchTarget) -> dict[str, object]:
    """A SkyPilot task: ``num_nodes`` nodes of ``accelerators: GPU:per_node``, the engine pinned
    (pip for vLLM on NVIDIA, else the recipe's image), the weights in a bucket SkyPilot keeps
    (``persistent``), each node's command from its rank, and a ``service`` for ``sky serve``."""
    engine = recipe.engines[top.engine]
    head, worker, env = _start(top, recipe, target)
    resources: dict[str, object] = {
        "accelerators": f"{top.gpu}:{top.gpus_per_node}",
        "disk_size": math.ceil(target.disk_bytes / 1e9),
        "disk_tier": "best",
        "ports": [target.port],
    }
    if top.nodes > 1:
        resources["network_tier"] = "best"  # InfiniBand / RDMA where the cloud has it
    setup = "set -e\n"
    image = _image(top, recipe)
    if top.engine == "vllm" and _accelerator_vendor(top) == "nvidia" and engine.version:
        setup += f"python3 -m pip install --quiet 'vllm=={engine.version}'\n"
    elif image:
        resources["image_id"] = f"docker:{image}"
    setup += 'if [ "${SKYPILOT_SETUP_NODE_RANK:-0}" = 0 ]; then\n' + "".join(f"  {line}\n" for line in _download(target).splitlines()) + "fi\n"
    run = (
        "set -e\n"
        'HEAD=$(echo "$SKYPILOT_NODE_IPS" | head -n1)\n'
        "RANK=${SKYPILOT_NODE_RANK}\n"
        + _wait_for_weights(target)
        + 'if [ "$RANK" = 0 ]; then\n'
        + f"  exec {head}\n"
        + "else\n"
        + f"  exec {worker}\n"
        + "fi\n"
    )
    return {
        "name": target.name,
        "num_nodes": top.nodes,
        "resources": resources,
        "envs": {"MODEL_REPO": target.hf_repo, **env},
        "secrets": {"HF_TOKEN": None},
        "file_mounts": {WEIGHTS_MOUNT: {"name": target.volume, "persistent": True, "mode": "MOUNT_CACHED"}},
        "setup": setup,
        "run": run,
        "service": {
            "readiness_probe": {"path": "/v1/models", "initial_delay_seconds": recipe.ready_timeout_s, "timeout_seconds": 60},
            "replicas": 1,
        },
    }


def _container(top: Topology, image: str, script: str, env: dict[str, str], target: LaunchTarget, *, probe: bool) -> dict[str, object]:
    gpu_resource = "amd.com/gpu" if _accelerator_vendor(top) == "amd" else "nvidia.com/gpu"
    container: dict[str, object] = {
        "name": top.engine,
        "image": image,
        "command": ["sh", "-c", script],
        "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}}}]
        + [{"name": name, "value": value} for name, value in env.items()],
        "ports": [{"containerPort": target.port, "name": "http"}],
        "resources": {"limits": {gpu_resource: top.gpus_per_node}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "weights", "mountPath": WEIGHTS_MOUNT}],
    }
    if probe:
        container["readinessProbe"] = {
            "httpGet": {"path": "/v1/models", "port": target.port},
            "initialDelaySeconds": 60,
            "periodSeconds": 30,
            "failureThreshold": 240,
        }
    return container


def _pod(containers: list[dict[str, object]], target: LaunchTarget, init: list[dict[str, object]] | None = None) -> dict[str, object]:
    spec: dict[str, object] = {
        "containers": containers,
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
            {"name": "weights", "persistentVolumeClaim": {"claimName": target.volume}},
        ],
    }
    if init:
        spec["initContainers"] = init
    return spec


def leaderworkerset(top: Topology, recipe: LaunchRecipe, target: LaunchTarget) -> list[dict[str, object]]:
    """The PersistentVolumeClaim for the weights, the LeaderWorkerSet (one group of ``nodes``
    pods, recreated whole when one restarts; the leader downloads the weights once), and the
    Service in front of the leader, in the order ``kubectl apply`` needs them."""
    image = _image(top, recipe)
    if image is None:
        image = "vllm/vllm-openai:latest" if top.engine == "vllm" else "lmsysorg/sglang:latest"
    head, worker, env = _start(top, recipe, target)
    leader_script = "set -e\nHEAD=${LWS_LEADER_ADDRESS}\n" + f"exec {head}\n"
    worker_script = "set -e\nHEAD=${LWS_LEADER_ADDRESS}\nRANK=${LWS_WORKER_INDEX}\n" + _wait_for_weights(target) + f"exec {worker}\n"
    download: dict[str, object] = {
        "name": "weights",
        "image": image,
        "command": ["sh", "-c", "set -e\n" + _download(target)],
        "env": _container(top, image, "", {}, target, probe=False)["env"],
        "volumeMounts": [{"name": "weights", "mountPath": WEIGHTS_MOUNT}],
    }
    labels = {"app": target.name}
    claim: dict[str, object] = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": target.volume, "labels": labels},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": f"{math.ceil(target.weights_bytes * 1.25 / 1e11) * 100}G"}}},
    }
    lws: dict[str, object] = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": target.name, "labels": labels},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": top.nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {
                    "metadata": {"labels": {**labels, "role": "leader"}},
                    "spec": _pod([_container(top, image, leader_script, env, target, probe=True)], target, [download]),
                },
                "workerTemplate": {
                    "metadata": {"labels": {**labels, "role": "worker"}},
                    "spec": _pod([_container(top, image, worker_script, env, target, probe=False)], target),
                },
            },
        },
    }
    service: dict[str, object] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": target.name, "labels": labels},
        "spec": {
            "selector": {"leaderworkerset.sigs.k8s.io/name": target.name, "role": "leader"},
            "ports": [{"name": "http", "port": target.port, "targetPort": target.port, "protocol": "TCP"}],
        },
    }
    return [claim, lws, service]
