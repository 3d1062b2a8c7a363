"""llama.cpp's own quantizer (llama_cpp.llama_model_quantize), the reference `infer quantize` is
compared with byte for byte."""
from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp
import numpy as np

FTYPES = {"Q4_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M, "Q5_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M,
          "Q6_K": llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K, "Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
          "Q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, "Q4_K_S": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_S,
          "Q5_K_S": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_S, "Q5_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_0,
          "F16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16, "BF16": llama_cpp.LLAMA_FTYPE_MOSTLY_BF16,
          "MXFP4_MOE": llama_cpp.LLAMA_FTYPE_MOSTLY_MXFP4_MOE}


def llama_quantize(src: Path, out: Path, ftype: str, imatrix: dict[str, np.ndarray] | None = None,
                   kv: list[tuple[str, int, object]] = (), allow_requantize: bool = False) -> None:
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = FTYPES[ftype]
    p.nthread = 2
    p.allow_requantize = allow_requantize
    keep = []
    if imatrix:
        arr = (llama_cpp.llama_model_imatrix_data * (len(imatrix) + 1))()
        for i, (name, v) in enumerate(imatrix.items()):
            v = np.ascontiguousarray(v, dtype=np.float32)
            keep.append(v)
            arr[i].name = name.encode()
            arr[i].data = v.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            arr[i].size = v.size
        p.imatrix = arr
        keep.append(arr)
    if kv:
        # What llama-quantize's main() adds for an imatrix: these overrides become the quantize.imatrix.* keys.
        ov = (llama_cpp.llama_model_kv_override * (len(kv) + 1))()
        for i, (key, tag, value) in enumerate(kv):
            ov[i].key = key.encode()
            ov[i].tag = tag
            if tag == llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR:
                ov[i].value.val_str = value.encode()
            else:
                ov[i].value.val_i64 = value
        p.kv_overrides = ov
        keep.append(ov)
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), p) == 0
