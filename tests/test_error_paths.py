"""Every command's common error paths, run as a user meets them: one ``error:`` line and a
``hint:`` line on stderr, the exit code of errors.py's table (2: the input cannot be used; 1: it
could not be done), and never a traceback — no engine needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import run_cli

#: (name, argv, extra environment, exit code, the start of the error line)
CASES = [
    ("inspect a missing file", ["inspect", "/nonexistent/model.gguf"], {}, 2, "error: /nonexistent/model.gguf: no such file"),
    ("inspect what is not a GGUF", ["inspect", "{not_gguf}"], {}, 2, "error: {not_gguf}: at byte 0: not a GGUF file"),
    ("check a context too small", ["check", "--ctx", "12"], {}, 2, "error: --ctx '12' is not a context size"),
    ("check an unknown GPU", ["check", "--gpu", "RTX 9999"], {}, 2, "error: --gpu 'RTX 9999' is neither a size nor a GPU we know"),
    ("check RAM without a number", ["check", "--ram", "lots"], {}, 2, "error: cannot read 'lots' as a size"),
    ("check an unknown name", ["check", "no-such-model"], {}, 2, "error: 'no-such-model' is neither a catalog model nor a GGUF path"),
    (
        "check offline from the hub",
        ["check", "hf://Qwen/Qwen3-8B-GGUF/Qwen3-8B-Q4_K_M.gguf"],
        {"HF_HUB_OFFLINE": "1"},
        2,
        "error: hf://Qwen/Qwen3-8B-GGUF/Qwen3-8B-Q4_K_M.gguf: HF_HUB_OFFLINE is set",
    ),
    (
        "check a hub that does not resolve",
        ["check", "hf://Qwen/Qwen3-8B-GGUF/Qwen3-8B-Q4_K_M.gguf"],
        {"HF_ENDPOINT": "http://hub.invalid"},
        2,
        "error: hf://Qwen/Qwen3-8B-GGUF/Qwen3-8B-Q4_K_M.gguf: cannot reach the hub",
    ),
    ("check a URL that refuses", ["check", "http://127.0.0.1:1/model.gguf"], {}, 2, "error: http://127.0.0.1:1/model.gguf: cannot fetch"),
    ("pull a model that never fits", ["pull", "kimi-k3"], {}, 2, "error: 'kimi-k3' never fits one machine"),
    ("serve an unknown name", ["serve", "no-such-model"], {}, 2, "error: 'no-such-model' is neither a GGUF file nor a catalog model"),
    ("serve without an engine", ["serve", "/nonexistent.gguf"], {"TIERLOCAL_LLAMA_SERVER": "/nonexistent/llama-server"}, 2, "error: "),
    ("status with nothing running", ["status", "--port", "1"], {}, 1, "error: no tierlocal serve is running on port 1"),
    ("bench with nothing running", ["bench"], {}, 1, "error: no tierlocal serve is running"),
    ("plan an unknown name", ["plan", "no-such-model"], {}, 2, "error: no-such-model: not a model in the catalog"),
    ("show an unknown name", ["catalog", "show", "no-such-model"], {}, 2, "error: 'no-such-model' is not in the catalog"),
    (
        "install a unit for a missing file",
        ["service", "install", "serve", "/nonexistent.gguf", "--dir", "{scratch}"],
        {},
        2,
        "error: /nonexistent.gguf: no such model file",
    ),
    ("usage without its config", ["usage", "--config", "/nonexistent.toml"], {}, 2, "error: /nonexistent.toml: cannot read it"),
    ("gateway without its config", ["gateway", "--config", "/nonexistent.toml"], {}, 2, "error: /nonexistent.toml: cannot read it"),
    ("a bad option value", ["engine", "build", "--jobs", "0"], {}, 2, "error: Invalid value for '--jobs'"),
    ("an unknown command", ["frobnicate"], {}, 2, "error: No such command 'frobnicate'"),
]


@pytest.mark.parametrize(("name", "argv", "env", "code", "start"), CASES, ids=[case[0] for case in CASES])
def test_an_error_is_one_line_a_hint_and_its_exit_code(
    name: str, argv: list[str], env: dict[str, str], code: int, start: str, tmp_path: Path
) -> None:
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("not a gguf")
    fill = {"not_gguf": str(not_gguf), "scratch": str(tmp_path / "unit")}
    argv = [arg.format(**fill) for arg in argv]
    result = run_cli(*argv, env={"TIERLOCAL_HOME": str(tmp_path / "home"), "HF_HOME": str(tmp_path / "hf"), **env})
    lines = result.stderr.splitlines()
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert result.returncode == code, (name, result.returncode, result.stderr)
    assert lines and lines[0].startswith(start.format(**fill)), lines
    assert len([line for line in lines if line.startswith("error: ")]) == 1 and any(line.startswith("hint: ") for line in lines), lines
