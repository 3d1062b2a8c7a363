"""Hostile importance-matrix files for the fuzz tests (tests/test_fuzz_gguf.py) and the long run
(scripts/fuzz_gguf.py --format imatrix): llama.cpp's legacy .dat and GGUF imatrix files made for a
tiny float model, mutated (fields retyped, counts and lengths changed, truncated, extended), and
given to `infer quantize --imatrix` (quantize_model) by this file's own worker
(`python tests/helpers/imatrix_fuzz.py MODEL`), which answers as gguf_fuzz's worker does.
"""
from __future__ import annotations

import random
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: `helpers` for this file run as a worker

from helpers.gguf_fuzz import mutate as mutate_gguf  # noqa: E402
from helpers.gguf_fuzz import serve  # noqa: E402

# The quantization types the imatrix cases go through (a case's file name says which).
IMATRIX_TYPES = ("Q4_K_M", "Q4_0", "Q6_K", "Q5_K_S")


def imatrix_seeds(folder: Path) -> tuple[Path, list[Path]]:
    """A tiny float GGUF (converted from an HF folder) and valid legacy / GGUF imatrix files for it."""
    import numpy as np

    from helpers.hf_models import make_hf_model
    from infer.models.convert_hf import write_gguf_unquantized
    from infer.models.gguf_file import read_gguf

    model = folder / "imatrix-model.gguf"
    if not model.exists():
        make_hf_model(folder / "imatrix-hf", "llama", seed=2)
        write_gguf_unquantized(folder / "imatrix-hf", folder / "imatrix-model.partial")
        (folder / "imatrix-model.partial").rename(model)
    rng = np.random.default_rng(0)
    # As llama-imatrix records them: every matmul weight but the embeddings (a lookup, not a matmul).
    sums = {n: rng.uniform(0.1, 20, size=t.shape[-1]).astype(np.float32) for n, t in read_gguf(model).tensors.items()
            if len(t.shape) == 2 and n != "token_embd.weight"}
    legacy, gguf_im = folder / "seed.imatrix.dat", folder / "seed.imatrix.gguf"
    if not legacy.exists():
        with open(legacy, "wb") as f:
            f.write(struct.pack("<i", len(sums)))
            for name, v in sums.items():
                f.write(struct.pack("<i", len(name)) + name.encode())
                f.write(struct.pack("<ii", 7, v.size) + v.astype("<f4").tobytes())
            f.write(struct.pack("<ii", 12, len("calibration.txt")) + b"calibration.txt")
    if not gguf_im.exists():
        _write_gguf_imatrix(gguf_im, sums)
    return model, [legacy, gguf_im]


def _write_gguf_imatrix(path: Path, sums: dict) -> None:
    """As llama-imatrix writes since mid-2025: per weight, in_sum2 (n_mat, ne0) and counts (n_mat, 1)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "imatrix")
    w.add_string("general.type", "imatrix")
    w.add_array("imatrix.datasets", ["calibration.txt"])
    w.add_uint32("imatrix.chunk_count", 12)
    w.add_uint32("imatrix.chunk_size", 512)
    for name, v in sums.items():
        w.add_tensor(name + ".in_sum2", v.reshape(1, -1))
        w.add_tensor(name + ".counts", np.full((1, 1), 7, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _retyped_imatrix(data: bytes, rng: random.Random) -> bytes:
    """A GGUF imatrix with the same tensors and one metadata key of another type or an extreme
    value, well formed (byte-level mutations of a value type rarely leave a file that parses)."""
    import tempfile

    import gguf
    import numpy as np
    from gguf import GGUFValueType as VT

    meta = {"general.type": (VT.STRING, "imatrix"), "imatrix.datasets": (VT.ARRAY, ["calibration.txt"]),
            "imatrix.chunk_count": (VT.UINT32, 12), "imatrix.chunk_size": (VT.UINT32, 512)}
    key = rng.choice(sorted(meta))
    meta[key] = rng.choice([(VT.UINT64, 2**40), (VT.INT32, -5), (VT.STRING, "abc"), (VT.STRING, "x" * 300),
                            (VT.FLOAT32, float("nan")), (VT.BOOL, True), (VT.UINT32, 2**32 - 1), (VT.ARRAY, [1, 2]),
                            (VT.ARRAY, ["a", "b"])])
    if rng.random() < 0.2:
        del meta[key]
    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "in.gguf", Path(d) / "out.gguf"
        src.write_bytes(data)
        tensors = [(t.name, np.array(t.data)) for t in gguf.GGUFReader(src).tensors]
        w = gguf.GGUFWriter(str(dst), "imatrix")
        for k, (vtype, v) in meta.items():
            sub = (VT.STRING if v and isinstance(v[0], str) else VT.INT32) if vtype == VT.ARRAY else None
            w.add_key_value(k, v, vtype, sub_type=sub)
        for name, a in tensors:
            w.add_tensor(name, a)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return dst.read_bytes()


def _legacy_fields(b: bytes) -> list[tuple[str, int]]:
    """(kind, position) of the legacy file's 4-byte fields, as far as it parses."""
    out, pos = [("n_entries", 0)], 4
    try:
        for _ in range(min(int.from_bytes(b[:4], "little", signed=True), 4096)):
            out.append(("name_len", pos))
            pos += 4 + int.from_bytes(b[pos:pos + 4], "little", signed=True)
            out += [("ncall", pos), ("nval", pos + 4)]
            nval = int.from_bytes(b[pos + 4:pos + 8], "little", signed=True)
            out += [("value", pos + 8 + 4 * i) for i in range(0, max(0, min(nval, 4096)), 37)]
            pos += 8 + 4 * nval
        out += [("chunks", pos), ("dataset_len", pos + 4)]
    except (ValueError, OverflowError):
        pass
    return [(k, p) for k, p in out if 0 <= p <= len(b) - 4]


def mutate_imatrix(data: bytes, rng: random.Random) -> bytes:
    """A mutated imatrix file: GGUF ones as gguf_fuzz mutates models (plus their float data), legacy
    ones field by field (counts, lengths, call counts, values: NaN, Inf, negative), flipped, truncated."""
    if data[:4] == b"GGUF":
        if rng.random() < 0.2:
            return _retyped_imatrix(data, rng)
        out = bytearray(mutate_gguf(data, rng))
        if rng.random() < 0.3 and len(out) > 64:  # the sums and counts themselves
            j = rng.randrange(len(out) // 2, len(out) - 3)
            out[j:j + 4] = struct.pack("<f", rng.choice([float("nan"), float("inf"), -1.0, 0.0, 1e38, -1e-38]))
        return bytes(out)
    b = bytearray(data)
    fs = _legacy_fields(bytes(b))
    for _ in range(rng.randint(1, 3)):
        how = rng.random()
        if how < 0.7 and fs:
            kind, pos = rng.choice(fs)
            if kind == "value":
                b[pos:pos + 4] = struct.pack("<f", rng.choice([float("nan"), float("inf"), -float("inf"), -1.0, 0.0,
                                                                3e38, 1e-45]))
            else:
                v = rng.choice([0, 1, -1, 2, 7, 255, 256, 2**31 - 1, -(2**31), rng.randrange(2**20)])
                b[pos:pos + 4] = struct.pack("<i", v)
        elif how < 0.85:
            j = rng.randrange(len(b))
            b[j] ^= 1 << rng.randrange(8)
        elif how < 0.95:
            del b[rng.randrange(len(b)):]
            break
        else:
            b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    return bytes(b)


def imatrix_worker(model: str) -> None:
    """Quantize `model` with each imatrix file named on stdin (as `infer quantize --imatrix` does);
    the quantization type is the case's suffix (`…--Q4_0.dat`), Q4_K_M by default."""
    import tempfile

    from infer.models.quantize_file import QuantizeOptions, quantize_model

    with tempfile.TemporaryDirectory(prefix="imatrix-fuzz-") as d:
        out = Path(d) / "out.gguf"
        # numba compiles the quantizers here, before READY (a minute when its cache is cold or stale),
        # rather than within the first case's timeout
        for ftype in IMATRIX_TYPES:
            quantize_model(model, out, QuantizeOptions(type=ftype, force=True))

        def quantize(path: str) -> None:
            stem = Path(path).name.split(".")[0]
            ftype = stem.split("--")[1] if "--" in stem else "Q4_K_M"
            quantize_model(model, out, QuantizeOptions(type=ftype, imatrix=Path(path), force=True))

        serve(quantize)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/helpers/imatrix_fuzz.py MODEL.gguf")
    imatrix_worker(sys.argv[1])
