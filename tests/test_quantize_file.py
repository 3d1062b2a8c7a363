"""`infer quantize` against llama.cpp's own quantizer (llama_cpp.llama_model_quantize) on the same input:
same tensors, types, shapes, bytes and metadata, i.e. the same file."""
from __future__ import annotations

import struct
from pathlib import Path

import gguf
import llama_cpp
import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT

from helpers.cli import assert_one_line_error, infer
from helpers.llama_quantize import FTYPES, llama_quantize
from helpers.tiny_deepseek2 import write_tiny_deepseek2
from helpers.tiny_models import GEMMA4_PER_LAYER, add_common_kvs, add_spm_vocab, write_tiny_gemma4, write_tiny_model
from infer.models.gguf_file import read_gguf
from infer.models.quantize_file import QuantizeError, QuantizeOptions, quantize_model

# Each architecture's model is stored in a different float type, and only llama has its own output.weight.
pytestmark = pytest.mark.reference  # llama.cpp's quantizer is the reference of every test (and imported above)
ARCH_DTYPE = {"llama": GT.F32, "qwen2": GT.F32, "qwen3": GT.F16, "gemma3": GT.BF16, "phi3": GT.F16, "olmo2": GT.BF16,
              "qwen3moe": GT.F16, "lfm2": GT.BF16, "qwen35": GT.F16, "lfm2moe": GT.F32, "granitehybrid": GT.BF16,
              "qwen35moe": GT.BF16, "qwen3next": GT.F16, "granitehybrid-moe": GT.F16,
              "smollm3": GT.BF16, "mistral3": GT.F32, "glm4moe": GT.BF16,
              "deepseek2": GT.BF16, "deepseek2-lite": GT.F16, "llama4": GT.BF16, "gemma4": GT.BF16,
              "gemma4-moe": GT.F16, "deepseek2-kvb": GT.BF16, "deepseek2-lite-kvb": GT.F16}
N_EXPERT, N_FF_EXP = 4, 256  # the tiny qwen3moe's, lfm2moe's and qwen35moe's experts (3-D tensors)


def write_float_model(path: Path, arch: str, dtype: GT = GT.F32, D: int = 256, F: int = 512, n_layer: int | None = None,
                      nan_in: str | None = None, seed: int = 0) -> Path:
    """A random model whose 2-D weights are F32/F16/BF16: what llama-quantize takes as input
    ("granitehybrid-moe": granitehybrid with experts F wide and a shared expert, Granite 4.0 H Tiny's layout;
    deepseek2: tiny_deepseek2.py's, its MLA tensors 3-D, or "-kvb" in the older layout: attn_kv_b, which
    llama.cpp quantizes as a V projection)."""
    if arch in ("deepseek2", "deepseek2-lite", "deepseek2-kvb", "deepseek2-lite-kvb"):
        return write_tiny_deepseek2(path, arch, seed, 320, 256, None, dtype)
    if arch == "gemma4":  # E2B's layout: shared-KV layers, per-layer embeddings, global layers without attn_v
        return write_tiny_gemma4(path, seed, shared=True, per_layer=GEMMA4_PER_LAYER, float_type=dtype)
    if arch == "gemma4-moe":  # 26B-A4B's layout: experts (ffn_gate_up_exps) beside the dense FFN in every layer
        return write_tiny_gemma4(path, seed, float_type=dtype, moe=True)
    rng = np.random.default_rng(seed)
    granite_moe = arch == "granitehybrid-moe"
    arch = "granitehybrid" if granite_moe else arch
    H, Hkv, hd, n_vocab = 4, 2, 64, 320
    n_layer = n_layer or (6 if arch == "gemma3" else 4 if arch == "glm4moe" else 3)
    w = gguf.GGUFWriter(str(path), arch)
    # lfm2: short convolutions around an attention layer, head_count_kv per layer (0: a convolution);
    # lfm2moe: the same layers, the first with a dense FFN, the others with experts and their selection bias
    # qwen35 (qwen35moe, qwen3next): gated delta nets around a gated attention layer (full_attention_interval 2)
    lfm = arch in ("lfm2", "lfm2moe")
    gdn = arch in ("qwen35", "qwen35moe", "qwen3next")
    # granitehybrid: Mamba-2 layers around an attention layer, head_count_kv per layer (0: Mamba-2)
    recurrent = [i % 2 == 0 for i in range(n_layer)] if lfm or gdn or arch == "granitehybrid" else [False] * n_layer
    S, Hk, Hv = 64, 2, 4  # qwen35's delta net: head size, key heads, value heads
    C = 2 * Hk * S + Hv * S
    add_common_kvs(w, arch, D, 0 if arch == "qwen35moe" else F, n_layer, H,
                   [0 if r else Hkv for r in recurrent] if lfm or arch == "granitehybrid" else Hkv, hd)
    Hm, Gm, Nm = 8, 2, 64  # granitehybrid's Mamba-2: heads, groups, state size (inner size 2 D)
    Cm = 2 * D + 2 * Gm * Nm
    if arch == "granitehybrid":
        for add_key, v in ((w.add_ssm_conv_kernel, 4), (w.add_ssm_state_size, Nm), (w.add_ssm_group_count, Gm),
                           (w.add_ssm_time_step_rank, Hm), (w.add_ssm_inner_size, 2 * D)):
            add_key(v)
        w.add_rope_scaling_finetuned(False)
    if lfm:
        w.add_shortconv_l_cache(3)
    if gdn:
        w.add_full_attention_interval(2)
        if arch != "qwen3next":
            w.add_rope_dimension_sections([11, 11, 10, 0])
        for add_key, v in ((w.add_ssm_conv_kernel, 4), (w.add_ssm_state_size, S), (w.add_ssm_group_count, Hk),
                           (w.add_ssm_time_step_rank, Hv), (w.add_ssm_inner_size, Hv * S)):
            add_key(v)
    moe = arch in ("qwen3moe", "lfm2moe", "qwen35moe", "qwen3next", "glm4moe", "llama4") or granite_moe
    Fe = F if granite_moe else N_FF_EXP  # granitehybrid's experts are feed_forward_length wide
    if moe:
        w.add_expert_count(N_EXPERT)
        w.add_expert_used_count(2)
        if not granite_moe:
            w.add_expert_feed_forward_length(N_FF_EXP)
    if arch == "llama4":  # experts in every 2nd layer (the 2nd), a dense FFN in the others
        w.add_interleave_moe_layer_step(2)
    if arch in ("lfm2moe", "glm4moe"):
        w.add_leading_dense_block_count(1)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if arch == "glm4moe":  # GLM-4.5's: a shared expert, scaled weights, half-head RoPE, its last block an MTP layer
        w.add_expert_shared_count(1)
        w.add_expert_weights_scale(2.5)
        w.add_expert_weights_norm(True)
        w.add_rope_dimension_count(hd // 2)
        w.add_nextn_predict_layers(1)
    if gdn and moe or granite_moe:
        w.add_expert_shared_feed_forward_length(N_FF_EXP)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(0)  # an input's own file type: the output must move it to the end with the new value
    add_spm_vocab(w, n_vocab, ("<|endoftext|>",) if arch == "phi3" else ())

    def add(name: str, shape: tuple[int, ...]) -> None:
        if len(shape) == 1:
            w.add_tensor(name, (1.0 + rng.normal(0, 0.1, size=shape)).astype(np.float32))
            return
        x = rng.normal(0, 0.02, size=shape).astype(np.float32)
        x.reshape(-1, shape[-1])[0, :8] *= 40  # a few outliers, so scale searches have something to do
        if name == nan_in:
            x[1, 3] = np.nan
        if dtype == GT.F32:
            w.add_tensor(name, x)
        elif dtype == GT.F16:
            w.add_tensor(name, x.astype(np.float16))
        else:
            bits = (x.view(np.uint32) >> 16).astype(np.uint16)  # truncation is fine for a test input
            w.add_tensor(name, bits.view(np.uint8).reshape(*shape[:-1], -1), raw_dtype=GT.BF16)  # shape in bytes

    add("token_embd.weight", (n_vocab, D))
    add("token_embd_norm.weight" if lfm else "output_norm.weight", (D,))
    if arch in ("llama", "olmo2"):
        add("output.weight", (n_vocab, D))
    for i in range(n_layer):
        p = f"blk.{i}."
        if arch != "olmo2":
            add(p + "attn_norm.weight", (D,))
        if recurrent[i] and gdn:  # the conv kernel, dt bias and A F32, as llama.cpp's converter
            add(p + "attn_qkv.weight", (C, D))
            add(p + "attn_gate.weight", (Hv * S, D))
            if arch == "qwen3next":
                add(p + "ssm_ba.weight", (2 * Hv, D))
            else:
                add(p + "ssm_beta.weight", (Hv, D))
                add(p + "ssm_alpha.weight", (Hv, D))
            w.add_tensor(p + "ssm_conv1d.weight", rng.normal(0, 0.5, size=(C, 4)).astype(np.float32))
            w.add_tensor(p + "ssm_dt.bias", rng.uniform(0.5, 1.5, size=Hv).astype(np.float32))
            w.add_tensor(p + "ssm_a", -rng.uniform(0.1, 1.0, size=Hv).astype(np.float32))
            add(p + "ssm_norm.weight", (S,))
            add(p + "ssm_out.weight", (D, Hv * S))
        elif recurrent[i] and arch == "granitehybrid":  # conv kernel and bias, dt bias, A, D F32 as the converter
            add(p + "ssm_in.weight", (2 * D + Cm + Hm, D))
            w.add_tensor(p + "ssm_conv1d.weight", rng.normal(0, 0.5, size=(Cm, 4)).astype(np.float32))
            w.add_tensor(p + "ssm_conv1d.bias", rng.normal(0, 0.1, size=Cm).astype(np.float32))
            w.add_tensor(p + "ssm_dt.bias", rng.uniform(-1.0, 0.5, size=Hm).astype(np.float32))
            w.add_tensor(p + "ssm_a", -rng.uniform(0.1, 1.0, size=(Hm, 1)).astype(np.float32))
            w.add_tensor(p + "ssm_d", rng.uniform(0.5, 1.5, size=(Hm, 1)).astype(np.float32))
            w.add_tensor(p + "ssm_norm.weight", (1.0 + rng.normal(0, 0.1, size=(Gm, D))).astype(np.float32))
            add(p + "ssm_out.weight", (D, 2 * D))
        elif recurrent[i]:  # the conv kernel F32, as llama.cpp's converter writes it (and never quantizes it)
            add(p + "shortconv.in_proj.weight", (3 * D, D))
            w.add_tensor(p + "shortconv.conv.weight", rng.normal(0, 0.5, size=(D, 3)).astype(np.float32))
            add(p + "shortconv.out_proj.weight", (D, D))
        elif arch == "phi3":  # fused: llama.cpp's recipe has its own rule for attn_qkv
            add(p + "attn_qkv.weight", ((H + 2 * Hkv) * hd, D))
        elif gdn:  # Q and the output gate interleaved per head
            add(p + "attn_q.weight", (2 * H * hd, D))
            add(p + "attn_k.weight", (Hkv * hd, D))
            add(p + "attn_v.weight", (Hkv * hd, D))
        else:
            add(p + "attn_q.weight", (H * hd, D))
            add(p + "attn_k.weight", (Hkv * hd, D))
            add(p + "attn_v.weight", (Hkv * hd, D))
        if not recurrent[i]:
            add(p + "attn_output.weight", (D, H * hd))
        if arch == "qwen2":
            add(p + "attn_q.bias", (H * hd,))
        if arch == "glm4moe":
            add(p + "attn_q.bias", (H * hd,))
            add(p + "attn_k.bias", (Hkv * hd,))
            add(p + "attn_v.bias", (Hkv * hd,))
        if arch in ("qwen3", "gemma3", "qwen3moe", "glm4moe") or (lfm or gdn) and not recurrent[i]:
            add(p + "attn_q_norm.weight", (hd,))
            add(p + "attn_k_norm.weight", (hd,))
        if gdn or arch == "glm4moe":
            add(p + "post_attention_norm.weight", (D,))
        elif arch == "olmo2":
            add(p + "attn_q_norm.weight", (H * hd,))
            add(p + "attn_k_norm.weight", (Hkv * hd,))
            add(p + "post_attention_norm.weight", (D,))
            add(p + "post_ffw_norm.weight", (D,))
        else:
            add(p + "ffn_norm.weight", (D,))
        if arch == "glm4moe" and i == n_layer - 1:  # the MTP layer's own tensors
            add(p + "nextn.eh_proj.weight", (D, 2 * D))
            for name in ("enorm", "hnorm", "shared_head_norm"):
                add(p + f"nextn.{name}.weight", (D,))
        if moe and not (arch in ("lfm2moe", "glm4moe") and i == 0) and not (arch == "llama4" and i % 2 == 0):
            # the router and the experts' 3-D tensors
            add(p + "ffn_gate_inp.weight", (N_EXPERT, D))
            if arch in ("lfm2moe", "glm4moe"):
                add(p + "exp_probs_b.bias", (N_EXPERT,))
            add(p + "ffn_gate_exps.weight", (N_EXPERT, Fe, D))
            add(p + "ffn_up_exps.weight", (N_EXPERT, Fe, D))
            add(p + "ffn_down_exps.weight", (N_EXPERT, D, Fe))
            if gdn or granite_moe or arch in ("glm4moe", "llama4"):  # the shared expert, a gdn's gate a (D,) row
                # (never quantized: one dimension)
                if gdn:
                    add(p + "ffn_gate_inp_shexp.weight", (D,))
                add(p + "ffn_gate_shexp.weight", (N_FF_EXP, D))
                add(p + "ffn_up_shexp.weight", (N_FF_EXP, D))
                add(p + "ffn_down_shexp.weight", (D, N_FF_EXP))
            continue
        if arch == "phi3":  # gate and up in one matrix
            add(p + "ffn_up.weight", (2 * F, D))
        else:
            add(p + "ffn_gate.weight", (F, D))
            add(p + "ffn_up.weight", (F, D))
        add(p + "ffn_down.weight", (D, F))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def assert_same_file(ours: Path, ref: Path) -> None:
    a, b = read_gguf(ours), read_gguf(ref)
    assert list(a.tensors) == list(b.tensors)  # order too
    for name, t in b.tensors.items():
        u = a.tensors[name]
        assert (u.type_name, u.shape) == (t.type_name, t.shape), name
        assert np.array_equal(u.raw, t.raw), f"{name} ({t.type_name}): bytes differ"
    assert list(a.metadata) == list(b.metadata)
    for key, v in b.metadata.items():
        assert a.kv_types[key] == b.kv_types[key], key
        assert np.array_equal(a.metadata[key], v) if isinstance(v, np.ndarray) else a.metadata[key] == v, key
    assert ours.read_bytes() == ref.read_bytes()  # and so the padding and alignment as well


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("float_models")
    return {arch: write_float_model(d / f"{arch}.gguf", arch, dt) for arch, dt in ARCH_DTYPE.items()}


@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0"])
@pytest.mark.parametrize("arch", list(ARCH_DTYPE))
def test_matches_llama_cpp(models, tmp_path: Path, arch: str, ftype: str):
    ours, ref = tmp_path / "ours.gguf", tmp_path / "ref.gguf"
    s = quantize_model(models[arch], ours, QuantizeOptions(type=ftype, threads=2))
    llama_quantize(models[arch], ref, ftype)
    assert_same_file(ours, ref)
    assert s.bytes_after < s.bytes_before and s.file_size == ours.stat().st_size


@pytest.mark.parametrize("ftype", ["Q4_K_S", "Q5_K_S", "Q5_0", "F16", "BF16"])
def test_other_file_types_match(models, tmp_path: Path, ftype: str):
    ours, ref = tmp_path / "ours.gguf", tmp_path / "ref.gguf"
    quantize_model(models["llama"], ours, QuantizeOptions(type=ftype))
    llama_quantize(models["llama"], ref, ftype)
    assert_same_file(ours, ref)


@pytest.mark.parametrize("arch", ["qwen3moe", "llama", "lfm2moe", "granitehybrid-moe", "glm4moe", "deepseek2",
                                  "gemma4-moe"])
def test_mxfp4_moe_matches_llama_cpp(models, tmp_path: Path, arch: str):
    """MXFP4_MOE: the experts (3-D tensors) in MXFP4, every other tensor in Q8_0, the output or
    tied embeddings too (lfm2moe's convolution kernels and granitehybrid's Mamba-2 kernels, A, D and
    norms stay F32); a model without experts is all Q8_0. llama.cpp takes every 3-D tensor for
    experts: deepseek2's per-head attn_k_b and attn_v_b are MXFP4 as well."""
    ours, ref = tmp_path / "ours.gguf", tmp_path / "ref.gguf"
    quantize_model(models[arch], ours, QuantizeOptions(type="MXFP4_MOE", threads=2))
    llama_quantize(models[arch], ref, "MXFP4_MOE")
    assert_same_file(ours, ref)
    g = read_gguf(ours)
    types = {n: t.type_name for n, t in g.tensors.items()
             if len(t.shape) > 1 and "gate_inp" not in n and "shortconv.conv" not in n
             and not n.endswith(("ssm_conv1d.weight", "ssm_a", "ssm_d", "ssm_norm.weight"))}
    want = {n: "MXFP4" if n.endswith(("_exps.weight", "attn_k_b.weight", "attn_v_b.weight")) else "Q8_0"
            for n in types}
    assert types == want and g.metadata["general.file_type"] == 38
    assert ("MXFP4" in types.values()) == (arch != "llama")


@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "MXFP4_MOE"])
def test_fallback_types_for_odd_row_lengths(tmp_path: Path, ftype: str):
    # ne0 = 288 fits 32-blocks but not 256 (Q4_K -> Q5_0, Q6_K -> Q8_0); ffn_down's 200 fits neither (-> F16,
    # also straight from a 32-element type: Q8_0).
    src = write_float_model(tmp_path / "odd.gguf", "llama", D=288, F=200)
    ours, ref = tmp_path / "ours.gguf", tmp_path / "ref.gguf"
    s = quantize_model(src, ours, QuantizeOptions(type=ftype))
    llama_quantize(src, ref, ftype)
    assert_same_file(ours, ref)
    types = {n: t.type_name for n, t in read_gguf(ours).tensors.items()}
    assert types["blk.0.ffn_down.weight"] == "F16" and types["output.weight"] == "Q8_0"
    assert any("do not fit" in w for w in s.warnings)


def write_legacy_imatrix(path: Path, entries: dict[str, np.ndarray], ncall: int, chunks: int, dataset: str) -> None:
    with open(path, "wb") as f:
        f.write(struct.pack("<i", len(entries)))
        for name, v in entries.items():
            f.write(struct.pack("<i", len(name)) + name.encode())
            f.write(struct.pack("<ii", ncall, v.size) + v.astype("<f4").tobytes())
        f.write(struct.pack("<i", chunks) + struct.pack("<i", len(dataset)) + dataset.encode())


@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q4_0"])
def test_imatrix_matches_llama_cpp(models, tmp_path: Path, ftype: str):
    rng = np.random.default_rng(5)
    g = read_gguf(models["llama"])
    # Like llama-imatrix output: every matmul weight except the embeddings (a lookup, not a matmul).
    sums = {n: rng.uniform(0.1, 20, size=t.shape[-1]).astype(np.float32) for n, t in g.tensors.items()
            if len(t.shape) == 2 and n != "token_embd.weight"}
    im_path = tmp_path / "imatrix.dat"
    write_legacy_imatrix(im_path, sums, ncall=7, chunks=12, dataset="calibration.txt")
    ours, ref = tmp_path / "ours.gguf", tmp_path / "ref.gguf"
    quantize_model(models["llama"], ours, QuantizeOptions(type=ftype, imatrix=im_path))
    S, I = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR, llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT
    llama_quantize(models["llama"], ref, ftype, imatrix={n: v / np.float32(7) for n, v in sums.items()},
                   kv=[("quantize.imatrix.file", S, str(im_path)), ("quantize.imatrix.dataset", S, "calibration.txt"),
                       ("quantize.imatrix.entries_count", I, len(sums)), ("quantize.imatrix.chunks_count", I, 12)])
    assert_same_file(ours, ref)
    # The importance weights changed the result: the same type without them gives other bytes.
    plain = tmp_path / "plain.gguf"
    quantize_model(models["llama"], plain, QuantizeOptions(type=ftype))
    assert not np.array_equal(read_gguf(plain).tensors["blk.0.attn_q.weight"].raw,
                              read_gguf(ours).tensors["blk.0.attn_q.weight"].raw)


def test_overrides_and_pure_match(models, tmp_path: Path):
    ours, ref = tmp_path / "ours.gguf", tmp_path / "ref.gguf"
    quantize_model(models["llama"], ours, QuantizeOptions(type="Q4_K_M", output_tensor_type="Q8_0",
                                                          token_embedding_type="Q6_K"))
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.output_tensor_type, p.token_embedding_type = FTYPES["Q4_K_M"], GT.Q8_0, GT.Q6_K
    assert llama_cpp.llama_model_quantize(str(models["llama"]).encode(), str(ref).encode(), p) == 0
    assert_same_file(ours, ref)
    types = {n: t.type_name for n, t in read_gguf(ours).tensors.items()}
    assert types["output.weight"] == "Q8_0" and types["token_embd.weight"] == "Q6_K"

    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.pure = FTYPES["Q4_K_M"], True
    ref.unlink()
    assert llama_cpp.llama_model_quantize(str(models["llama"]).encode(), str(ref).encode(), p) == 0
    quantize_model(models["llama"], ours, QuantizeOptions(type="Q4_K_M", pure=True, force=True))
    assert_same_file(ours, ref)
    assert {t.type_name for t in read_gguf(ours).tensors.values()} == {"Q4_K", "F32"}


def test_requantize(tmp_path: Path):
    src = write_tiny_model(tmp_path / "mixed.gguf", "llama")  # every quant type the engine reads
    ours, ref = tmp_path / "ours.gguf", tmp_path / "ref.gguf"
    with pytest.raises(QuantizeError, match="--allow-requantize"):
        quantize_model(src, ours, QuantizeOptions(type="Q4_K_M"))
    assert not ours.exists()
    s = quantize_model(src, ours, QuantizeOptions(type="Q4_K_M", allow_requantize=True))
    assert any("requantizing" in w for w in s.warnings)
    llama_quantize(src, ref, "Q4_K_M", allow_requantize=True)
    assert_same_file(ours, ref)


def test_interrupted_run_leaves_nothing(models, tmp_path: Path, monkeypatch):
    import infer.models.quantize_file as mq
    from infer.quant.quantizers import quantize

    calls = []

    def flaky(type_id, x, imatrix=None):
        calls.append(type_id)
        if len(calls) == 5:
            raise KeyboardInterrupt  # Ctrl-C in the middle of the tensors
        return quantize(type_id, x, imatrix)

    monkeypatch.setattr(mq, "_quantizer", lambda: flaky)
    out = tmp_path / "out.gguf"
    with pytest.raises(KeyboardInterrupt):
        quantize_model(models["llama"], out, QuantizeOptions())
    assert list(tmp_path.iterdir()) == []  # neither OUT nor a temporary file

    out.write_bytes(b"old")  # an existing file survives a failed --force run untouched
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        quantize_model(models["llama"], out, QuantizeOptions(force=True))
    assert out.read_bytes() == b"old" and list(tmp_path.iterdir()) == [out]


# --------------------------------------------------------------------------- the command line


@pytest.mark.e2e
def test_cli_quantize_and_run(models, tmp_path: Path):
    out = tmp_path / "q.gguf"
    r = infer("quantize", str(models["qwen2"]), str(out), "--threads", "2")
    assert r.returncode == 0, r.stderr
    assert "Q4_K_M" in r.stderr and "Q4_K" in r.stderr and "MiB" in r.stderr
    ref = tmp_path / "ref.gguf"
    llama_quantize(models["qwen2"], ref, "Q4_K_M")
    assert out.read_bytes() == ref.read_bytes()
    r = infer("run", str(out), "hi", "--raw", "-n", "2", "--temperature", "0", "--json")
    assert r.returncode == 0, r.stderr  # the engine loads what it wrote

    assert_one_line_error(infer("quantize", str(models["qwen2"]), str(out)), str(out), "--force")
    r = infer("quantize", str(models["qwen2"]), str(out), "--type", "Q8_0", "--force")
    assert r.returncode == 0 and read_gguf(out).metadata["general.file_type"] == 7, r.stderr


@pytest.mark.e2e
def test_cli_bad_input(tmp_path: Path, models):
    out = tmp_path / "o.gguf"
    assert_one_line_error(infer("quantize", str(tmp_path / "nope.gguf"), str(out)), "nope.gguf", "no such file")
    assert_one_line_error(infer("quantize", str(models["llama"]), str(out), "--type", "Q3_XYZ"), "Q3_XYZ")

    t5 = tmp_path / "t5.gguf"  # an architecture llama.cpp has and infer does not
    w = gguf.GGUFWriter(str(t5), "t5")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((32, 256), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    assert_one_line_error(infer("quantize", str(t5), str(out)), "unsupported architecture 't5'")

    nan = write_float_model(tmp_path / "nan.gguf", "llama", n_layer=2, nan_in="blk.1.ffn_up.weight")
    assert_one_line_error(infer("quantize", str(nan), str(out)), "blk.1.ffn_up.weight", "NaN")

    mixed = write_tiny_model(tmp_path / "mixed.gguf", "qwen2")
    assert_one_line_error(infer("quantize", str(mixed), str(out)), "already quantized", "--allow-requantize")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mixed.gguf", "nan.gguf", "t5.gguf"]
