"""The models a multi-model `infer serve` has in memory: loaded on first use, kept while requests
use them, unloaded after keep_alive idle (ollama's rule: default 5 minutes, 0 at once, negative
never) or to make room for another (--max-models, --memory: the least recently used idle one
goes first).

Requests for a model that is loading wait for that one load; a request that gives up (its client
went away) leaves the load running for the others.  A load that fails answers each waiting
request with the reason, and the other models keep serving.  Everything here runs on the
server's event loop; loading and unloading run in worker threads.
"""
from __future__ import annotations

import asyncio
import ctypes
import gc
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

FOREVER = 10 * 365 * 86400.0  # a keep_alive longer than this (or negative) keeps the model loaded


class LoadFailed(Exception):
    """A model that cannot be loaded (a bad file, too big for --memory): the message says why."""


@dataclass(eq=False)
class Loaded:
    name: str  # as the catalog lists it
    path: Path
    llm: Any  # infer.engine.llm.LLM
    app: Any  # its own ASGI app (openai_server.create_app), the routes that name a model
    size: int  # bytes: the weights' files and the KV pool
    keep_alive: float  # seconds kept after its last request (< 0: forever)
    users: int = 0  # requests running on it
    expires: float = math.inf  # time.monotonic() after which an idle model is unloaded
    last_used: float = field(default_factory=time.monotonic)

    def expires_at(self) -> float:
        """Wall-clock time of its unloading (inf: not planned)."""
        if self.users or math.isinf(self.expires):
            return math.inf
        return time.time() + max(0.0, self.expires - time.monotonic())


def keep_alive_seconds(value: Any) -> float | None:
    """ollama's keep_alive: seconds as a number, or a duration "30s", "5m", "1h", "1h30m", "-1"
    (negative: forever); None when absent.  ValueError when it is neither."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("keep_alive must be a number of seconds or a duration such as '5m'")
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
        return -1.0 if seconds < 0 or seconds > FOREVER else seconds
    if not isinstance(value, str) or not value.strip():
        raise ValueError("keep_alive must be a number of seconds or a duration such as '5m'")
    s = value.strip()
    try:
        seconds = float(s)
    except ValueError:
        pass
    else:
        if math.isnan(seconds):
            raise ValueError("keep_alive must be a number of seconds or a duration such as '5m', not NaN")
        return -1.0 if seconds < 0 or seconds > FOREVER else seconds
    sign, s = (-1.0, s[1:]) if s.startswith("-") else (1.0, s)
    units = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    total, num = 0.0, ""
    i = 0
    while i < len(s):
        c = s[i]
        if c.isdigit() or c == ".":
            num += c
            i += 1
            continue
        unit = "ms" if s.startswith("ms", i) else c
        if unit not in units or not num:
            raise ValueError(f"keep_alive {value[:40]!r} is not a duration such as '5m', '1h' or '-1'")
        try:
            total += float(num) * units[unit]
        except ValueError:
            raise ValueError(f"keep_alive {value[:40]!r} is not a duration") from None
        num, i = "", i + len(unit)
    if num:
        raise ValueError(f"keep_alive {value[:40]!r} needs a unit (s, m or h)")
    return -1.0 if sign < 0 or total > FOREVER else total


class ModelPool:
    """build(name, path) -> (llm, app) loads a model (in a worker thread); estimate(path) -> bytes it
    will take (weights and KV pool), to make room before loading."""

    def __init__(self, build: Callable[[str, Path], tuple[Any, Any]], estimate: Callable[[Path], int],
                 max_models: int = 1, memory: int = 0, keep_alive: float = 300.0):
        if max_models < 1:
            raise ValueError(f"--max-models must be at least 1, got {max_models}")
        self.build, self.estimate = build, estimate
        self.max_models, self.memory, self.keep_alive = max_models, memory, keep_alive
        self.loaded: dict[str, Loaded] = {}
        self.loading: dict[str, tuple[asyncio.Task, int]] = {}  # name -> (its load, bytes reserved)
        self.unloading = 0  # bytes of models being unloaded: still taken until their memory is back
        self._changed: asyncio.Condition | None = None
        self._reaper: asyncio.Task | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._changed = asyncio.Condition()
        self._reaper = asyncio.ensure_future(self._reap())

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            try:
                await self._reaper
            except asyncio.CancelledError:
                pass
        for task, _ in list(self.loading.values()):
            try:
                await task
            except Exception:
                pass
        for m in list(self.loaded.values()):
            await self._unload(m)

    async def _reap(self) -> None:
        """Unload idle models whose keep_alive ran out."""
        while True:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            for m in list(self.loaded.values()):
                if not m.users and m.expires <= now:
                    try:
                        await self._unload(m)
                    except Exception:  # one failed unload must not stop every later expiry
                        pass

    # -- requests ----------------------------------------------------------------------------------

    async def acquire(self, name: str, path: Path) -> Loaded:
        """The loaded model, loading it (and making room) first if need be; the caller must
        release() it.  Raises LoadFailed."""
        while True:
            m = self.loaded.get(name)
            if m is not None:
                m.users += 1
                m.last_used = time.monotonic()
                return m
            if name in self.loading:
                await asyncio.shield(self.loading[name][0])  # its LoadFailed is ours too
                continue
            try:
                need = await asyncio.to_thread(self.estimate, path)
            except Exception as e:  # a file that cannot even be read
                msg = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise LoadFailed(f"model '{name}' failed to load: {msg}") from None
            if name in self.loaded or name in self.loading:
                continue  # another request started it meanwhile
            if self.memory and need > self.memory:
                raise LoadFailed(f"model '{name}' needs {need / 2**20:.0f} MiB (weights and KV cache) but "
                                 f"--memory allows {self.memory / 2**20:.0f} MiB")
            if not await self._make_room(need) or name in self.loaded or name in self.loading:
                continue  # the world changed while it made room: look again
            task = asyncio.ensure_future(self._load(name, path, need))
            task.add_done_callback(_retrieved)  # a failed load nobody waits for any more is not an error to log
            self.loading[name] = (task, need)

    def release(self, m: Loaded, keep_alive: float | None = None) -> None:
        """A request on m ended; keep_alive (seconds) replaces the model's when given."""
        m.users -= 1
        if keep_alive is not None:
            m.keep_alive = keep_alive
        m.last_used = time.monotonic()
        if not m.users:
            m.expires = math.inf if m.keep_alive < 0 else m.last_used + m.keep_alive
        self._notify()

    def expire(self, name: str) -> bool:
        """keep_alive 0 on a model: unloaded as soon as it is idle (now if it is); False: not loaded."""
        m = self.loaded.get(name)
        if m is None:
            return False
        m.keep_alive = 0.0
        if not m.users:
            m.expires = time.monotonic()
        return True

    async def unload(self, name: str) -> bool:
        """Unload an idle model now; False when it is in use (or not loaded)."""
        m = self.loaded.get(name)
        if m is None or m.users:
            return False
        await self._unload(m)
        return True

    # -- inside ------------------------------------------------------------------------------------

    def _used(self) -> tuple[int, int]:
        """(models, bytes) loaded or loading."""
        return (len(self.loaded) + len(self.loading),
                sum(m.size for m in self.loaded.values()) + sum(n for _, n in self.loading.values()) + self.unloading)

    async def _make_room(self, need: int) -> bool:
        """Unload idle models, least recently used first, until one more of `need` bytes fits;
        when all are busy, wait for a release.  False if it had to wait (the caller looks again)."""
        while True:
            count, used = self._used()
            if count < self.max_models and (not self.memory or used + need <= self.memory):
                return True
            idle = sorted((m for m in self.loaded.values() if not m.users), key=lambda m: m.last_used)
            if idle:
                await self._unload(idle[0])
                continue
            async with self._changed:
                await self._changed.wait()
            return False

    async def _load(self, name: str, path: Path, need: int) -> None:
        try:
            llm, app = await asyncio.to_thread(self.build, name, path)
        except Exception as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise LoadFailed(f"model '{name}' failed to load: {msg}") from None
        finally:
            self.loading.pop(name, None)
            self._notify()
        size = need
        try:
            size = _file_bytes(path) + llm.engine.usage().bytes_total
        except Exception:
            pass
        llm.engine.start()
        m = Loaded(name, path, llm, app, size, self.keep_alive)
        # idle until its waiting requests take it (if they all left, it expires as any idle model)
        m.expires = math.inf if m.keep_alive < 0 else time.monotonic() + m.keep_alive
        self.loaded[name] = m
        self._notify()

    async def _unload(self, m: Loaded) -> None:
        if self.loaded.get(m.name) is not m:
            return
        del self.loaded[m.name]
        self.unloading += m.size
        llm = m.llm
        m.llm = m.app = None
        try:
            await asyncio.to_thread(_stop, llm)
            del llm
            await asyncio.to_thread(_give_back_memory)
        finally:
            self.unloading -= m.size
            self._notify()

    def _notify(self) -> None:
        if self._changed is None:
            return

        async def wake() -> None:
            async with self._changed:
                self._changed.notify_all()

        asyncio.ensure_future(wake())


def _give_back_memory() -> None:
    """The unloaded model's arrays and mappings freed now (not at the next gc cycle), and the heap's
    free pages handed back to the OS (glibc keeps them otherwise: ~90 MB per unload of the
    embedded model, measured)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): its allocator decides
        pass


def _retrieved(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()


def _stop(llm) -> None:
    llm.engine.stop()


def _file_bytes(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    return path.stat().st_size
