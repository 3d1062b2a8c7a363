"""One copy of the weights in memory: the CPU runner's packed tensors leave the file mapping,
--no-mmap reads nothing from the file after loading, --mlock pins the weights."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.tiny_models import tiny_seed, write_tiny_model
from infer.backends.cpu.repack import PackedWeight
from infer.backends.cpu.runner import CpuRunner
from infer.models.gguf_file import read_gguf
from infer.models.loader import load_model
from infer.quant.tensor import file_offset

linux = pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads /proc/self/smaps")


def _smaps_field(a: np.ndarray, field: str) -> int:
    """The /proc/self/smaps value `field` (e.g. "Rss") of the mapping that holds array `a`."""
    addr = a.__array_interface__["data"][0]
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and all(c in "0123456789abcdef-" for c in head[0]):
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            inside = lo <= addr < hi
        elif inside and line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(f"no mapping holds the array, or it has no {field}")


def _mapping_rss(a: np.ndarray) -> int:
    """Resident bytes of the file mapping that holds array `a` (this model's map of the file,
    whatever other tests mapped)."""
    return _smaps_field(a, "Rss") * 1024


def _resident_kib(a: np.ndarray) -> int:
    """KiB of array `a`'s own pages that are resident (mincore over exactly its range): the kernel
    merges neighbouring anonymous mappings, so the smaps entry that holds `a` can count other
    allocations' pages too."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    addr = a.__array_interface__["data"][0]
    start = addr - addr % page
    n = -(-(addr + a.nbytes - start) // page)
    vec = (ctypes.c_ubyte * n)()
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(n * page), vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(v & 1 for v in vec) * page // 1024


def _is_mapped(a: np.ndarray) -> bool:
    while a is not None:
        if isinstance(a, np.memmap):
            return True
        a = a.base
    return False


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _logits(runner, ids) -> np.ndarray:
    return runner.forward(np.asarray(ids, np.int32), 0, runner.new_kv_cache(64), all_logits=True).copy()


IDS = [2, 818, 5279, 529, 7001, 563, 236761]


@linux
def test_packed_tensors_leave_the_mapping(gemma_path):
    """After loading, the file's pages of every repacked tensor are released: what stays resident
    of the mapping is a small part of the file (norms; embedding rows looked up), not a copy."""
    model = load_model(gemma_path)
    runner = CpuRunner(model.config, model.weights, n_threads=2)
    size = gemma_path.stat().st_size
    _logits(runner, IDS)
    assert _mapping_rss(model.weights.output.raw) < 0.05 * size
    assert isinstance(runner.output, PackedWeight)


def _present_bytes(addr: int, nbytes: int) -> int:
    """Bytes of [addr, addr + nbytes) whose pages this process has mapped in (/proc/self/pagemap's
    present bit): one mapping's pages, whatever the page cache holds."""
    page = os.sysconf("SC_PAGE_SIZE")
    first, last = addr // page, (addr + nbytes - 1) // page
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = np.frombuffer(f.read((last - first + 1) * 8), np.uint64)
    return int((entries >> np.uint64(63)).sum()) * page


@linux
def test_split_attn_q_is_not_copied(tmp_path):
    """Qwen3.5's attn_q holds per head Q's rows then the gate's: loading splits it into per-head
    views of the file (models/mixer_weights.py), not copies, and the cpu backend packs Q and the gate
    from them and releases the file's pages: one copy of attn_q in memory, the packed one (a copy
    and its file pages beside it cost Qwen3.5-4B 180 MiB)."""
    path = write_tiny_model(tmp_path / "tiny-qwen35.gguf", "qwen35", seed=tiny_seed("qwen35"))
    model = load_model(path)
    il = model.config.layer_recurrent.index(False)  # a gated attention layer
    lw = model.weights.layers[il]
    assert all(_is_mapped(p.raw) for w in (lw.wq, lw.attn_gate) for p in w.parts)
    runner = CpuRunner(model.config, model.weights, n_threads=2)
    assert all(isinstance(w, PackedWeight) for w, _ in runner.layers[il].qkv)
    embd = model.weights.token_embd.raw  # a view of the model's map of the file
    t = read_gguf(path).tensors[f"blk.{il}.attn_q.weight"].raw
    assert t.nbytes > 16 * 4096
    addr = embd.__array_interface__["data"][0] + file_offset(t)[1] - file_offset(embd)[1]
    # released a part at a time, whole pages each: at most a page where two parts meet stays (the 4B: 1 MiB)
    assert _present_bytes(addr, t.nbytes) <= (len(lw.wq.parts) + len(lw.attn_gate.parts) + 1) * 4096


@linux
def test_embedding_rows_are_read_not_mapped(gemma_path):
    """Token embeddings are read from the file (rows.py), not through the mapping, whose fault-around
    would make ~64 KiB of the embedding resident per distinct token: 96 varied tokens map less
    than a page each (the logits equal --no-mmap's in the next test)."""
    model = load_model(gemma_path)
    runner = CpuRunner(model.config, model.weights, n_threads=2)
    ids = np.random.default_rng(0).integers(0, model.config.n_vocab, 96)
    _logits(runner, IDS)
    before = _mapping_rss(model.weights.token_embd.raw)
    runner.forward(ids.astype(np.int32), 0, runner.new_kv_cache(128))
    assert _mapping_rss(model.weights.token_embd.raw) - before < 96 * 4096


@linux
def test_no_mmap_same_logits_and_no_file_pages(gemma_path):
    model = load_model(gemma_path)
    ref = _logits(CpuRunner(model.config, model.weights, n_threads=2), IDS)
    model = load_model(gemma_path)
    runner = CpuRunner(model.config, model.weights, n_threads=2, mmap=False)
    before = _mapping_rss(model.weights.output.raw)
    assert np.array_equal(_logits(runner, IDS), ref)
    # the forward pass touched no page of the file: every array the runner reads is its own
    assert _mapping_rss(model.weights.output.raw) <= before
    kept = [runner.token_embd.raw, runner.output_norm, *(a for lay in runner.layers for a in vars(lay).values()
                                                          if isinstance(a, np.ndarray))]
    assert not any(_is_mapped(a) for a in kept)


@linux
def test_mlock_pins_the_weights(gemma_path):
    model = load_model(gemma_path)
    before = _status_kb("VmLck")
    runner = CpuRunner(model.config, model.weights, n_threads=2, mlock=True)
    packed = runner.output.nbytes + sum(p.nbytes for lay in runner.layers for p, _ in lay.qkv)
    assert (_status_kb("VmLck") - before) * 1024 >= packed
    _logits(runner, IDS)


@pytest.mark.e2e
def test_cli_no_mmap_mlock(gemma_path):
    p = subprocess.run([sys.executable, "-m", "infer.cli", "run", str(gemma_path), "--no-mmap", "--mlock",
                        "--temperature", "0", "-n", "4", "Hello"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip()


@linux
def test_populate_then_release_a_mapping(tmp_path):
    """populate_mapped maps a read-only mapping's pages in one call (packing reads each chunk so,
    instead of faulting page by page); release_mapped drops them; neither touches other memory."""
    from infer.quant.tensor import populate_mapped, release_mapped

    path = tmp_path / "w.bin"
    data = np.arange(4 << 20, dtype=np.uint8)
    data.tofile(path)
    a = np.memmap(path, mode="r")
    assert _mapping_rss(a) < (1 << 20)
    populate_mapped(a)
    assert _mapping_rss(a) >= 0.99 * a.nbytes
    release_mapped(a)
    assert _mapping_rss(a) < (1 << 20)
    b = data.copy()  # anonymous memory: left alone
    populate_mapped(b)
    release_mapped(b)
    np.testing.assert_array_equal(b, data)
    np.testing.assert_array_equal(a, data)


def _thp_mode() -> str | None:
    p = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not p.exists():
        return None
    return p.read_text().split("[")[1].split("]")[0]


@linux
@pytest.mark.skipif(_thp_mode() in (None, "never"), reason="transparent huge pages are off")
def test_large_packed_arrays_ask_for_huge_pages():
    """Packed planes of several MiB are allocated in a mapping advised MADV_HUGEPAGE (fewer TLB
    misses when a decode step streams them), hold what is written, and small ones stay np.empty."""
    from infer.backends.cpu.hugepages import HUGE, huge_empty

    a = huge_empty((3, 1000, 2048), np.uint16)
    assert a.shape == (3, 1000, 2048) and a.dtype == np.uint16 and a.flags.c_contiguous and a.flags.writeable
    assert a.__array_interface__["data"][0] % HUGE == 0
    a[...] = np.arange(2048, dtype=np.uint16)
    assert int(a[2, 999, 2047]) == 2047 and int(a[0, 0, 1]) == 1
    assert _smaps_field(a, "THPeligible") == 1
    assert _in_anonymous_mapping(a) and not _in_anonymous_mapping(huge_empty((16, 16), np.float32))


def test_arena_carves_aligned_arrays_that_do_not_overlap():
    """A mixture's small expert matrices share one huge-page allocation (HugeArena): each array
    64-byte aligned, its own bytes, and asking for more than the arena holds is an error."""
    from infer.backends.cpu.hugepages import HugeArena

    shapes = [((3, 5, 7), np.uint8), ((2, 9), np.uint16), ((0, 0, 0), np.uint8), ((4, 100), np.float32)]
    arena = HugeArena(sum(HugeArena.span(*sd) for sd in shapes))
    arrays = [arena.take(*sd) for sd in shapes]
    for a, (shape, dtype) in zip(arrays, shapes):
        assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous
        assert a.__array_interface__["data"][0] % HugeArena.ALIGN == 0
    for i, a in enumerate(arrays):
        a[...] = i + 1
    assert [int(a.min()) if a.size else i + 1 for i, a in enumerate(arrays)] == [1, 2, 3, 4]
    assert [int(a.max()) if a.size else i + 1 for i, a in enumerate(arrays)] == [1, 2, 3, 4]
    with pytest.raises(MemoryError, match="cannot hold"):
        arena.take((1,), np.uint8)


def _in_anonymous_mapping(a) -> bool:
    import mmap

    while a is not None and not isinstance(a, mmap.mmap):
        a = a.obj if isinstance(a, memoryview) else getattr(a, "base", None)
    return a is not None


@linux
def test_kv_cache_is_resident_only_where_written():
    """A KV cache's pages are zeroed by the OS when first written, in ordinary pages (not numpy's
    huge ones): a 4096-token cache costs nothing until used, and its first token a few pages per
    layer instead of 2 MiB of K and of V each (what made a first request 0.25 s slower)."""
    from types import SimpleNamespace

    from infer.backends.cpu.kv_pool import KVPool
    from infer.models.config import KVGroup

    cfg = SimpleNamespace(kv_groups=(KVGroup(0, (0, 1, 2, 3)),), kv_layer_index={i: (0, i) for i in range(4)},
                          kv_group_shape=lambda g: (2, 128, 128))
    pool = KVPool(cfg, [256], 16)
    k = pool.k[0]
    assert k.shape == (4, 4096, 2, 128) and k.dtype == np.uint16
    # measured before anything reads the array: a read of untouched pages maps the zero page, which
    # the kernel sometimes counts as resident (1 MiB of the 8 once, in CI)
    assert _in_anonymous_mapping(k) and _resident_kib(k) == 0
    k[:, 0] = 7  # one token in every layer
    assert 0 < _resident_kib(k) <= 4 * 4 * 2  # KiB: a 4 KiB page per layer, at most two
    assert _smaps_field(k, "AnonHugePages") == 0
    assert (k[:, 0] == 7).all() and not k[:, 1:].any()  # zeros where not written
