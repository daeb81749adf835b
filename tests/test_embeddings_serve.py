"""A catalog embedding model served for real: a sparse GGUF of Qwen3-Embedding-0.6B's published
shape (its header names last-token pooling, as the official file's does; byte tokens so it takes
text) through ``tierlocal serve`` and the real ``openai`` client."""

from __future__ import annotations

import threading
import time
import tomllib
from pathlib import Path

import openai
import psutil

from tests.support.assets import Assets
from tests.support.catalog_headers import MODELS, shape_arch
from tests.support.serving import serving
from tests.support.sparse_models import write_sparse_gguf


def _qwen3_embedding(directory: Path) -> Path:
    family = next(f for f in tomllib.loads(MODELS.read_text())["family"] if f["name"] == "qwen3-embedding-0.6b")
    return write_sparse_gguf(directory / "qwen3-embedding-0.6b.gguf", shape_arch("qwen3-embedding-0.6b", {**family["shape"], "text_vocab": True}))


def test_a_pooled_file_serves_embeddings_unasked_within_the_memory_its_plan_counts(assets: Assets, tmp_path: Path) -> None:
    """No --role: the header's pooling makes it an embeddings server. The load holds its plan,
    and once full batches come the engine's resident memory grows past what the load log shows —
    the output buffer's rows of logits — and stays within the plan's `in use`, which counts them."""
    with serving(assets, tmp_path, "--ctx", "2048", model=_qwen3_embedding(tmp_path)) as (_process, ready):
        assert "--embeddings" in ready["argv"] and ready["delta"]["verified"] is True, ready["delta"]
        mmap = next(mode for mode in ready["plan"]["host_memory"]["modes"] if mode["load_mode"] == "mmap")
        growth = mmap["output_grows_by_bytes"]
        assert growth == (151_669 + 1024) * 4 * 512 - 151_669 * 4  # a micro-batch of rows, less the one reserved at load
        engine = psutil.Process(ready["engine_pid"])
        peak, done = [engine.memory_info().rss], threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], engine.memory_info().rss)
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        client = openai.OpenAI(base_url=f"{ready['url']}/v1", api_key="unused", max_retries=0)
        for n in range(2):  # an input of its own each (a shared prefix would be reused), past one micro-batch
            text = " ".join(f"item {n}-{i} of list {n * 7 + i % 5}" for i in range(19))
            vectors = client.embeddings.create(model="qwen3-embedding-0.6b", input=text)
            assert len(vectors.data[0].embedding) == 1024 and vectors.usage.prompt_tokens > 512
        time.sleep(0.3)
        done.set()
        sampler.join()
    assert mmap["in_use_bytes"] - growth < peak[0] <= mmap["in_use_bytes"] * 1.03, (peak[0], mmap["in_use_bytes"], growth)
