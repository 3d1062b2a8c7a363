"""One root for the errors a user can cause: InferError (quant/errors.py), and `reported()` catching it."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import typer

from infer.cli.errors import reported
from infer.quant.errors import InferError

# Exceptions below the CLI that are control flow, never shown to a user: each caught where it is raised.
INTERNAL = {
    "infer.engine.regex_split.Unsupported": "a pattern the numba matcher declines; the caller falls back to `re`",
    "infer.engine.gemma4_format.SyntaxProblem": "a reply that is not a Gemma 4 call; caught in its module, the "
                                                "reply stays content",
}
LAYERS = ("infer.engine", "infer.models", "infer.backends", "infer.quant")


def _exception_classes():
    for layer in LAYERS:
        pkg = importlib.import_module(layer)
        for info in pkgutil.walk_packages(pkg.__path__, layer + "."):
            try:
                mod = importlib.import_module(info.name)
            except ImportError as e:  # an optional backend's extra not installed here
                pytest.skip(f"{info.name}: {e}")
            for name, obj in vars(mod).items():
                is_error = inspect.isclass(obj) and issubclass(obj, Exception) and not issubclass(obj, Warning)
                if is_error and obj.__module__ == info.name:
                    yield f"{info.name}.{name}", obj


def test_every_error_below_the_cli_derives_from_infer_error():
    """A new error class that forgets InferError would surface as a traceback from `infer run`."""
    found = dict(_exception_classes())
    assert len(found) >= 25
    strays = [n for n, c in found.items() if not issubclass(c, InferError) and n not in INTERNAL]
    assert not strays, f"derive these from InferError (or list them in INTERNAL with why): {strays}"
    assert set(INTERNAL) <= set(found), "INTERNAL names a class that no longer exists"


def test_subclasses_keep_their_builtin_base():
    """Code that catches ValueError (or RuntimeError) around these keeps catching them."""
    from infer.engine.engine import ModelRunError
    from infer.engine.sampler import InvalidSamplingParams
    from infer.models.gguf_file import GGUFError

    assert issubclass(GGUFError, ValueError) and issubclass(InvalidSamplingParams, ValueError)
    assert issubclass(ModelRunError, RuntimeError)


def test_sampling_errors_name_their_field():
    """An API reports the field at fault from the error, not by parsing its message."""
    from infer.engine.sampler import InvalidSamplingParams, SamplingParams

    for kwargs, field in [({"temperature": -1}, "temperature"), ({"top_p": 2}, "top_p"), ({"stop": ["", "x"]}, "stop"),
                          ({"max_tokens": 0}, "max_tokens"), ({"frequency_penalty": "a"}, "frequency_penalty"),
                          ({"repeat_last_n": -2}, "repeat_last_n"), ({"logprobs": 99}, "logprobs")]:
        with pytest.raises(InvalidSamplingParams) as e:
            SamplingParams(**kwargs)
        assert e.value.field == field, kwargs


@pytest.mark.parametrize("module, name", [
    ("infer.engine.stop", "StopStringError"), ("infer.engine.pooling", "PoolingError"),
    ("infer.quant.affine", "AffineError"), ("infer.models.arch", "UnknownArchitecture"),
    ("infer.models.gguf_file", "GGUFError"), ("infer.backends.base", "BackendError"),
])
def test_reported_turns_any_infer_error_into_one_line(module, name, capsys):
    """Including the four the old hand-kept list missed (stop strings, pooling, affine, architecture)."""
    cls = getattr(importlib.import_module(module), name)
    with pytest.raises(typer.Exit) as e, reported():
        raise cls("something is wrong\nsecond line")
    assert e.value.exit_code == 1
    assert capsys.readouterr().err == "error: something is wrong\n"


def test_reported_lets_bugs_through():
    with pytest.raises(KeyError), reported():
        raise KeyError("a bug shows its traceback")
