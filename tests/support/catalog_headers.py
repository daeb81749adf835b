"""Writes recipes/headers/: the compact header of every catalog quantisation, as llama.cpp's own
tools lay the file out.

For each recipes/models.toml family with a ``shape`` (its published config.json), a sparse F16
GGUF of that shape is written (tensor data a hole: nothing big on disk), and for each of its
quantisations the real ``llama-quantize --dry-run F16.gguf QUANT`` prints every tensor's new
type, in the order the quantised file holds them, without writing it. A second sparse GGUF with
those types, that order and the file type llama-quantize sets is then read back and kept in
compact form (tierlocal/gguf/compact.py). The quantisation rules are llama.cpp's, not ours: we
only read what its tool says.

The Gemma 3 270M entry's Q4_K_M header is instead captured from the real file the tests use.

    .venv/bin/python -m tests.support.catalog_headers [--only NAME] [--check] [--quantize BIN] [--gemma FILE]

``--check`` rewrites nothing and exits 1 if a checked-in header differs from what the tools
say now (tests/test_catalog.py runs it for a few entries).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Mapping
from pathlib import Path

from gguf import GGMLQuantizationType, LlamaFileType

from tests.support.assets import Assets, load_assets
from tests.support.sparse_models import SparseArch, _tensors, write_sparse_gguf
from tierlocal.fetch.sources import read_headers
from tierlocal.gguf.compact import to_compact

Q = GGMLQuantizationType
ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "recipes" / "models.toml"
HEADERS = ROOT / "recipes" / "headers"
#: One dry-run line: "[  12/ 291]  blk.0.attn_k.weight  - [ 4096,  1024, 1, 1], type =    f16, size = … (q4_K)".
DRY_RUN_LINE = re.compile(r"^\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[[^\]]*\], type =\s*(\w+), size =.*?(?:\((\w+)\))?\s*$")


def header_path(name: str, quant: str) -> Path:
    """Where a catalog entry's compact header lives."""
    return HEADERS / f"{name}.{quant}.json"


def shape_arch(name: str, shape: Mapping[str, object]) -> SparseArch:
    """The SparseArch a models.toml ``shape`` table describes (arrays become tuples)."""
    fields = {key: tuple(value) if isinstance(value, list) else value for key, value in shape.items()}
    return SparseArch(name=name, **fields)  # type: ignore[arg-type]


def f16_source(arch: SparseArch) -> dict[str, GGMLQuantizationType]:
    """What the converter writes: every matrix F16 (1-D tensors and the F32 ones stay F32)."""
    return {name: Q.F16 for name, _, qtype in _tensors(arch) if qtype != Q.F32}


def dry_run(quantize: Path, source: Path, quant: str) -> list[tuple[str, GGMLQuantizationType]]:
    """Every tensor's name and type after ``llama-quantize --dry-run source quant``, in file order."""
    result = subprocess.run([str(quantize), "--dry-run", str(source), quant], capture_output=True, text=True, timeout=300, check=False)
    if result.returncode != 0:
        raise SystemExit(f"llama-quantize --dry-run {source.name} {quant} failed ({result.returncode}): {result.stderr[-2000:]}")
    tensors = []
    for line in (result.stdout + result.stderr).splitlines():
        match = DRY_RUN_LINE.match(line.strip())
        if match:
            name, old, new = match.groups()
            tensors.append((name, Q[(new or old).upper()]))
    if not tensors:
        raise SystemExit(f"llama-quantize --dry-run {source.name} {quant} printed no tensor lines")
    return tensors


def quantised_header(name: str, shape: Mapping[str, object], quant: str, quantize: Path, scratch: Path) -> dict[str, object]:
    """The compact header of ``name`` at ``quant`` as llama-quantize would write it."""
    arch = shape_arch(name, shape)
    source = write_sparse_gguf(scratch / f"{name}-converted-F16.gguf", arch, retype=f16_source(arch), file_type=LlamaFileType.MOSTLY_F16)
    types = dry_run(quantize, source, quant)
    out = write_sparse_gguf(
        scratch / f"{name}-{quant}.gguf", arch, retype=dict(types), order=[tensor for tensor, _ in types], file_type=LlamaFileType[f"MOSTLY_{quant}"]
    )
    compact = to_compact(read_headers(str(out)))
    source.unlink()
    out.unlink()
    return compact


def captured_header(path: Path) -> dict[str, object]:
    """The compact header of a real file."""
    return to_compact(read_headers(str(path)))


def render(compact: Mapping[str, object]) -> str:
    """The checked-in text: one tensor per line, so that a diff shows which changed."""
    files = compact["files"]
    assert isinstance(files, list)
    lines = []
    for entry in files:
        body = {key: value for key, value in entry.items() if key != "tensors"}
        tensors = ",\n".join("  " + json.dumps(t, separators=(",", ":")) for t in entry["tensors"])
        lines.append(json.dumps(body, sort_keys=True, separators=(",", ":"))[:-1] + ',"tensors":[\n' + tensors + "\n]}")
    head = {key: value for key, value in compact.items() if key != "files"}
    return json.dumps(head, sort_keys=True, separators=(",", ":"))[:-1] + ',"files":[\n' + ",\n".join(lines) + "\n]}\n"


def _assets() -> Assets:
    assets = load_assets()
    if assets is None:
        raise SystemExit("the test engines are not prepared: run `bash tests/run.sh` once, or give --quantize and --gemma")
    return assets


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], help="a family name (repeatable)")
    parser.add_argument("--check", action="store_true", help="compare with the checked-in headers instead of writing")
    parser.add_argument("--quantize", type=Path, help="llama-quantize (default: the prepared test build)")
    parser.add_argument("--gemma", type=Path, help="the real Gemma 3 270M Q4_K_M file (default: the prepared test model)")
    args = parser.parse_args(argv)
    quantize = args.quantize or _assets().llama_quantize
    families = tomllib.loads(MODELS.read_text())["family"]
    if args.only:
        families = [family for family in families if family["name"] in args.only]
        if len(families) != len(args.only):
            raise SystemExit(f"unknown family in {args.only}")
    HEADERS.mkdir(exist_ok=True)
    differ = 0
    with tempfile.TemporaryDirectory(prefix="catalog-headers-") as scratch:
        for family in families:
            if "shape" not in family:
                continue
            for quant in family["quants"]:
                if family["name"] == "gemma-3-270m" and quant == "Q4_K_M":
                    compact = captured_header(args.gemma or _assets().gemma_gguf)
                else:
                    compact = quantised_header(family["name"], family["shape"], quant, quantize, Path(scratch))
                text, path = render(compact), header_path(family["name"], quant)
                if args.check:
                    same = path.is_file() and json.loads(path.read_text()) == json.loads(text)
                    differ += not same
                    print(f"{'same' if same else 'DIFFERS'}  {path.relative_to(ROOT)}")
                else:
                    path.write_text(text)
                    print(f"wrote {path.relative_to(ROOT)} ({len(text.encode()):,} bytes)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
