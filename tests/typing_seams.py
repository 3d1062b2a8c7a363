"""The seams between the parts, checked by mypy (.ci/run; [tool.mypy] in pyproject.toml), never
run: each backend's runner is a Runner (backends/base.py), and each backend's primitives are the
decoder's Primitives (models/arch/decoder.py), which neither side can state itself, since
backends and models import each other in no direction."""
from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from infer.backends.base import Runner, StatePoolLike
from infer.backends.cpu.kv_pool import KVPool
from infer.backends.cpu.primitives import CpuPrimitives
from infer.backends.cpu.runner import CpuRunner
from infer.backends.cpu.state_pool import StatePool
from infer.backends.llamacpp.runner import LlamaCppRunner
from infer.backends.llamacpp.slots import SlotPool
from infer.backends.mlx.kv_pool import MlxKVPool
from infer.backends.mlx.primitives import MlxPrimitives
from infer.backends.mlx.runner import MlxRunner
from infer.backends.mlx.state_pool import MlxStatePool
from infer.models.arch.decoder import Primitives


def cpu_runner_is_a_runner(r: CpuRunner) -> Runner[KVPool, StatePool]:
    return r


def mlx_runner_is_a_runner(r: MlxRunner) -> Runner[MlxKVPool, MlxStatePool]:
    return r


def llamacpp_runner_is_a_runner(r: LlamaCppRunner) -> Runner[SlotPool, StatePoolLike]:
    return r


def cpu_primitives_are_primitives(ops: CpuPrimitives) -> Primitives[np.ndarray[Any, Any]]:
    return ops


def mlx_primitives_are_primitives(ops: MlxPrimitives) -> Primitives[mx.array]:
    return ops

