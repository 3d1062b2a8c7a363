"""Two processes compiling one kernel at once leave numba's on-disk cache consistent
(quant/numba_cache.py): each signature's cache entry holds that signature's machine code.

Each process compiles a different signature of one cached function, with numba's cache saves
slowed so that both read the index before either writes it (the interleaving that, without the
lock, leaves the index naming one signature and the data file holding the other's code); a
third process then loads both from the cache and checks what each returns."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

KERNEL = """
from numba import njit

@njit(cache=True)
def plus_one(x):
    return x + 1
"""

# argv: the folder holding kernel.py, the argument's type, seconds to wait before writing the data file
COMPILE = """
import sys, time
import infer.quant  # installs the lock, as every part of infer that compiles does
from numba.core import caching

folder, kind, data_delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
load_index, save_data = caching.IndexDataCacheFile._load_index, caching.IndexDataCacheFile._save_data

def slow_load_index(self):
    overloads = load_index(self)
    time.sleep(1.5)  # the other process reads the same index meanwhile
    return overloads

def slow_save_data(self, name, data):
    time.sleep(data_delay)
    save_data(self, name, data)

caching.IndexDataCacheFile._load_index = slow_load_index
caching.IndexDataCacheFile._save_data = slow_save_data
sys.path.insert(0, folder)
import kernel
kernel.plus_one(3 if kind == "int" else 3.0)
"""

CHECK = """
import sys
import infer.quant
sys.path.insert(0, sys.argv[1])
import kernel
print(repr(kernel.plus_one(3)), repr(kernel.plus_one(3.0)), len(kernel.plus_one.stats.cache_hits))
"""


@pytest.mark.slow  # three processes and ~10 s of deliberate waiting: not for the edit loop
def test_concurrent_compiles_keep_each_signature_its_own_code(tmp_path):
    (tmp_path / "kernel.py").write_text(textwrap.dedent(KERNEL))
    cache = tmp_path / "cache"
    env = {"NUMBA_CACHE_DIR": str(cache), "PATH": "/usr/bin:/bin"}
    # The float process reads the index first and writes its data last; the int process writes
    # its index last: unlocked, the index would say "int: file 1" and file 1 hold float code.
    first = subprocess.Popen([sys.executable, "-c", COMPILE, str(tmp_path), "float", "3"], env=env)
    time.sleep(0.5)
    second = subprocess.Popen([sys.executable, "-c", COMPILE, str(tmp_path), "int", "0"], env=env)
    assert first.wait(timeout=120) == 0 and second.wait(timeout=120) == 0
    out = subprocess.run([sys.executable, "-c", CHECK, str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out[:2] == ["4", "4.0"], out
    assert out[2] == "2", "both signatures should load from the cache, not compile again"
