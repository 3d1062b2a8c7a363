"""The `infer` command line: Typer commands over the engine. No work happens here beyond reading
flags, loading a model and printing; requests run in infer.engine, models come from infer.models.

Modules, by what they are for:

- The application: `main.py` (the entry point: imports every command module, Ctrl-C as exit 130),
  `__main__.py` (`python -m infer.cli`), `app.py` (the Typer app each command registers on).
- One module per command, named for it: `run.py`, `chat.py`, `bench.py`, `serve.py`, `pull.py`,
  `quantize.py`, `kernels.py`, `backends.py`, `ps.py`, `store.py` (list, show, rm), `launch.py` (a
  coding agent on `infer serve`).
- Shared by the commands: `options.py` (the flags several commands take, declared once, and
  LoadOptions: the loading flags turned into one EngineConfig), `load.py` (loading a model with a
  status line and the backend's warnings), `errors.py` (expected errors as one line and exit 1),
  `sizes.py` (byte sizes as typed: 512M, 2G).
- `server/`: the HTTP server behind `infer serve` (its map: server/__init__.py).
"""
