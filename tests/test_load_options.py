"""cli/options.py's LoadOptions: the loading flags of run, chat, serve and bench, gathered by name
from a command's parameters, make the EngineConfig the commands used to spell out."""
from __future__ import annotations

import inspect

import pytest

from infer.cli import bench, chat, run, serve
from infer.cli.options import LoadOptions
from infer.engine.engine import EngineConfig, EngineConfigError
from infer.engine.speculative import SpecConfig

FLAGS = dict(ctx=2048, threads=3, backend="cpu", gpu_layers=7, mmap=False, mlock=True, cache_type_k="q8_0",
             cache_type_v="f16", kv_memory="1M", spec="ngram", spec_ngram_n=4, draft_max=5, draft=None,
             draft_min=1, draft_p_min=0.25)


def test_of_takes_the_fields_by_name_and_ignores_the_rest():
    load = LoadOptions.of({**FLAGS, "temperature": 0.3, "port": 8080})
    assert load == LoadOptions(**FLAGS)
    assert LoadOptions.of({"ctx": 512}) == LoadOptions(ctx=512)  # run/chat: no --kv-memory, the default


def test_engine_config_is_what_the_commands_built():
    cfg = LoadOptions(**FLAGS).engine_config(max_seqs=4, pooling="cls")
    assert cfg == EngineConfig(n_ctx=2048, n_threads=3, max_seqs=4, backend="cpu", gpu_layers=7, mmap=False,
                               mlock=True, cache_type_k="q8_0", cache_type_v="f16", kv_memory=1 << 20,
                               pooling="cls", spec=SpecConfig("ngram", 4, 5, "", 1, 0.25))
    assert LoadOptions().engine_config(n_ctx=9000).n_ctx == 9000  # bench: room for its prompt
    assert LoadOptions().engine_config() == EngineConfig(n_ctx=4096, max_seqs=1)


def test_engine_config_validates():
    with pytest.raises(EngineConfigError, match="--ctx"):
        LoadOptions(ctx=4).engine_config()


@pytest.mark.parametrize("command", [run.run, chat.chat, serve.serve, bench.bench])
def test_each_command_takes_every_loading_flag_but_kv_memory_where_it_has_none(command):
    params = inspect.signature(command).parameters
    missing = {f for f in FLAGS if f not in params}
    assert missing <= {"kv_memory"}
    for name, p in params.items():  # the defaults agree with LoadOptions'
        if name in FLAGS and name != "kv_memory":
            assert p.default.default == getattr(LoadOptions(), name), (command.__name__, name)
