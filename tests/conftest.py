"""Fixtures every test module shares, the markers, and the lanes they make.

Lanes (run from the repository root):
- `python -m pytest -m "not slow"`: the edit loop, under a minute on two otherwise idle cores
  once numba's cache is warm (the first run compiles the kernels: minutes; the threaded kernels
  slow down several times over when other work shares the cores).
- `python -m pytest`: everything, what CI runs (.ci/run); about 25 minutes cold on two cores.
- `-m reference`, `-m e2e`, `-m browser`: one kind of slow test alone.

Markers (declared in pyproject.toml; --strict-markers rejects others):
- reference: needs llama.cpp (llama-cpp-python), the reference infer is compared with; set by
  the llama_cpp, llama_vocab_dir and compare_llamacpp fixtures below, or marked in the module.
- e2e: starts `infer serve` (the `server` fixture below, or helpers.server.Server), runs the
  CLI as a subprocess (helpers.cli.infer), or runs a real model (the gemma_path and
  chat_model_path fixtures below: the embedded Gemma, the default chat model) end to end.
- browser: drives Chromium through the chat page (tests/test_webui.py).
- slow: kept out of the edit loop; pytest_collection_modifyitems below puts it on every
  reference, e2e and browser test; mark others slow by hand when they keep the lane over a minute.

Helpers shared by the tests are the package tests/helpers (its __init__ says what is where),
imported as `helpers.X`: pytest's default (prepend) import mode puts tests/, the folder of this
conftest and of the test modules, on sys.path (there is no tests/__init__.py). No test module
imports another.
"""
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """The embedded Gemma 3 270M (real weights), assembled once per machine under INFER_HOME."""
    from infer.models.default import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def chat_model_path() -> Path:
    """The default chat model (SmolLM2-135M-Instruct), fetched once per machine under INFER_HOME."""
    from infer.models.default import default_chat_model_path

    return default_chat_model_path()


@pytest.fixture(scope="session")
def llama_cpp():
    """llama-cpp-python, the reference of the tokenizer tests (they skip without it)."""
    return pytest.importorskip("llama_cpp")


@pytest.fixture(scope="session")
def compare_llamacpp():
    """scripts/compare_llamacpp.py as a module: its llama.cpp tracer, forced_ops and greedy_agreement."""
    import importlib.util
    import sys

    path = Path(__file__).resolve().parents[1] / "scripts" / "compare_llamacpp.py"
    spec = importlib.util.spec_from_file_location("compare_llamacpp", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def llama_vocab_dir() -> Path:
    """llama.cpp's ggml-vocab-*.gguf files and their test vectors (tests/helpers/llama_vocab.py)."""
    pytest.importorskip("llama_cpp")
    from helpers.llama_vocab import vocab_dir

    return vocab_dir()


# ------------------------------------------------------------------ `infer serve` in a subprocess
# One server per module that asks for `server`, configured by the three fixtures below, which a
# module overrides by defining fixtures of the same names (pytest's nearest definition wins).


@pytest.fixture(scope="module")
def server_model(gemma_path) -> Path | None:
    """The MODEL argument of the module's `infer serve`: the embedded Gemma; None serves every
    pulled model by name (several-models mode)."""
    return gemma_path


@pytest.fixture(scope="module")
def server_args() -> tuple[str, ...]:
    """The module's `infer serve` options after MODEL (two threads: the machine runs other tests)."""
    return ("--threads", "2")


@pytest.fixture(scope="module")
def server_env() -> dict[str, str]:
    """Environment variables the module's server gets on top of the tests' own (HF_HUB_OFFLINE=1)."""
    return {}


@pytest.fixture(scope="module")
def server(server_model, server_args, server_env, tmp_path_factory):
    """The module's `infer serve` (helpers.server.Server), up until the module's last test; then it
    must stop cleanly on SIGTERM, having logged no traceback."""
    from helpers.server import Server

    s = Server(server_model, tmp_path_factory.mktemp("serve"), *server_args, env_extra=server_env)
    yield s
    assert s.stop() == 0, s.output()
    assert "Traceback" not in s.output(), s.output()


# ------------------------------------------------------------------ markers and the edit-loop lane
REFERENCE_FIXTURES = {"llama_cpp", "llama_vocab_dir", "compare_llamacpp"}  # each needs llama-cpp-python
E2E_FIXTURES = {"server", "gemma_path", "chat_model_path"}  # a real `infer serve` process, the real models
SLOW_BY_NATURE = ("reference", "e2e", "browser")


def pytest_collection_modifyitems(config, items):
    """Marks what the fixtures show (llama.cpp -> reference, a server or a real model -> e2e), then `slow` on every
    reference, e2e and browser test, so that `-m "not slow"` is the edit-loop lane."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & REFERENCE_FIXTURES:
            item.add_marker(pytest.mark.reference)
        if names & E2E_FIXTURES:
            item.add_marker(pytest.mark.e2e)
        if any(item.get_closest_marker(m) for m in SLOW_BY_NATURE):
            item.add_marker(pytest.mark.slow)
