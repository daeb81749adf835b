"""serve's options without an engine: what the plan is asked for, llama-server options after
`--` checked against a binary's --help, and a unit's command line from the options."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tierlocal import constants
from tierlocal.cli.common import serve_argv
from tierlocal.engines.flags import check_engine_args, parse_help
from tierlocal.errors import UsageError
from tierlocal.fit.estimate import RunRequest
from tierlocal.serve.run import ServeOptions

HELP = """\
-c,    --ctx-size N                     size of the prompt context
-fa,   --flash-attn [on|off|auto]       set Flash Attention use
--temp N                                temperature
--swa-full                              use full-size SWA cache
-nkvo, --no-kv-offload                  disable KV offload
--rope-scaling {none,linear,yarn}       RoPE frequency scaling method
--rope-scale N                          RoPE context scaling factor
"""


def test_the_request_carries_what_was_asked_over_the_engines_defaults() -> None:
    options = ServeOptions(Path("m.gguf"), ngl=7, n_cpu_moe=3, cache_type_k="q8_0", cache_type_v="q4_0", flash_attn="off", ubatch=256)
    request = options.run_request(RunRequest(swa_full=False, all_outputs=True))
    assert (request.ngl, request.n_cpu_moe, request.cache_type_k, request.cache_type_v, request.flash_attn, request.n_ubatch) == (
        7,
        3,
        "q8_0",
        "q4_0",
        False,
        256,
    )
    assert request.all_outputs is True  # the engine's own default kept
    assert ServeOptions(Path("m.gguf"), flash_attn="auto").run_request().flash_attn is True
    assert ServeOptions(Path("m.gguf"), engine_args=("--swa-full",)).run_request().swa_full is True


def test_options_after_the_separator() -> None:
    flags = parse_help(HELP)
    assert check_engine_args(("--temp", "0.5", "--swa-full"), flags) == []
    assert check_engine_args(("--temp", "-1"), flags) == []  # a negative number is a value
    # A choice in braces holds commas: "--rope-scaling {none,linear,yarn}" was read as no option at all.
    assert check_engine_args(("--rope-scaling", "yarn", "--rope-scale", "2"), flags) == []
    assert "does not model" in check_engine_args(("-nkvo",), flags)[0]
    for args, words in ((("-c", "512"), "use serve's --ctx"), (("--flash-attn=on",), "use serve's --flash-attn"), (("--nope",), "no option --nope")):
        with pytest.raises(UsageError) as caught:
            check_engine_args(args, flags)
        assert words in f"{caught.value} {caught.value.hint}"


def test_a_units_command_line_keeps_what_differs_from_the_defaults(tmp_path: Path) -> None:
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}")
    options = ServeOptions(
        Path("m.gguf"),
        ctx="max",
        parallel="2",
        port=9000,
        gpus=("24GiB",),
        ngl=constants.NGL_ALL,
        chat_template=str(tmp_path / "." / "t.jinja"),
        cache_type_k="q8_0",
        flash_attn="off",
        ubatch=1024,
    )
    assert serve_argv(options) == [
        "--ctx",
        "max",
        "--parallel",
        "2",
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "--gpu",
        "24GiB",
        "--ngl",
        "all",
        "--chat-template",
        str(template),
        "--cache-type-k",
        "q8_0",
        "--flash-attn",
        "off",
        "--ubatch",
        "1024",
    ]
    assert "--ngl" not in serve_argv(ServeOptions(Path("m.gguf")))  # auto: planned where it runs
    assert "--ctx" not in serve_argv(ServeOptions(Path("m.gguf")))  # not given: the default, up to the model's training, where it runs


def test_a_missing_llama_server_says_where_it_looked_and_how_to_build_one(tmp_path: Path) -> None:
    """Checked before the model is read: the binary named by the environment, then none at all."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    named = run_cli("serve", str(model), env={"TIERLOCAL_LLAMA_SERVER": str(tmp_path / "nonexistent")})
    assert (named.returncode, named.stderr.splitlines()) == (
        2,
        [
            f"error: TIERLOCAL_LLAMA_SERVER={tmp_path / 'nonexistent'}: no such file",
            "hint: point it at a llama-server binary, unset it, or build one: tierlocal engine build",
        ],
    )
    home = tmp_path / "home"
    nowhere = run_cli("serve", str(model), env={"PATH": "/nonexistent-bin", "TIERLOCAL_HOME": str(home)})
    assert (nowhere.returncode, nowhere.stderr.splitlines()) == (
        2,
        [
            f"error: no llama-server found (none on PATH, none in {home / 'engines'})",
            "hint: build one: tierlocal engine build (or pass --llama-server PATH, or set TIERLOCAL_LLAMA_SERVER)",
        ],
    )
