"""MLX-format models (affine quantization itself: test_affine.py): mlx-community-style folders loaded into
infer's representation (llama / qwen2 / qwen3 / granite / olmo2 / gemma3 / gemma2, checked against the HF -> GGUF converter and
the numpy reference models), tokenizer.json tokenization, and `infer quantize --format mlx` writing
MLX folders from the embedded Gemma GGUF (round trip, tokenizer identity, atomic writes)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers.cli import assert_one_line_error, infer
from helpers.hf_models import (
    SAMPLES,
    bf16,
    from_bf16,
    gemma3_forward,
    hf_forward,
    make_gemma3,
    make_hf_model,
    write_safetensors,
)
from helpers.prompts import PROMPTS
from helpers.tiny_models import write_tiny_model
from infer.engine.hf_tokenizer import HFTokenizer
from infer.engine.tokenizer import Tokenizer
from infer.engine.tokenizer_json import write_tokenizer_files
from infer.models.convert_hf import permute_rope_rows, write_gguf_unquantized
from infer.models.gguf_file import read_gguf
from infer.models.hf_files import read_safetensors_header, st_view
from infer.models.loader import load_model
from infer.models.mlx_export import MlxExportOptions, export_mlx
from infer.models.weights import ModelLoadError
from infer.quant.affine import (
    AffineTensor,
    dequantize_affine,
    quantize_affine,
)

mx = pytest.importorskip("mlx.core")


# ----------------------------------------------------------------------------- tiny mlx-community folders


def _mlxify(src: Path, dst: Path, weights: dict[str, np.ndarray], prefix: str = "", dtype: str = "bfloat16",
            bits: int = 4, group_size: int = 32, overrides: dict | None = None) -> None:
    """An MLX folder as mlx-lm writes it from the HF folder `src`: every matrix quantized (scales and
    biases in `dtype`), vectors in `dtype`, `quantization` in config.json."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name not in ("model.safetensors", "config.json") and f.is_file():
            shutil.copy(f, dst / f.name)
    cfg = json.loads((src / "config.json").read_text())
    overrides = overrides or {}
    cfg["quantization"] = {"group_size": group_size, "bits": bits, "mode": "affine", **overrides}
    cfg["quantization_config"] = cfg["quantization"]
    (dst / "config.json").write_text(json.dumps(cfg))

    def stored(x):
        return (bf16(x), "BF16") if dtype == "bfloat16" else (x.astype(np.float16), "F16")

    out = {}
    for name, w in weights.items():
        full = prefix + name
        module = full[: -len(".weight")]
        o = overrides.get(module)
        if w.ndim == 2 and o is not False:
            b, g = (o["bits"], o["group_size"]) if isinstance(o, dict) else (bits, group_size)
            t = quantize_affine(w, b, g, scale_dtype=dtype)
            out[full] = (t.packed, "U32")
            out[module + ".scales"] = stored(t.scales)
            out[module + ".biases"] = stored(t.biases)
        else:
            out[full] = stored(w)
    write_safetensors(dst / "model.safetensors", out)


def _read_st(path: Path) -> dict[str, tuple[np.ndarray, str]]:
    """name -> (array, safetensors dtype); BF16 as uint16 bits (numpy has no bfloat16)."""
    return {k: (np.array(st_view(e)), e.dtype) for k, e in read_safetensors_header(path).items()}


def _dequantized_reference(folder: Path, prefix: str = "") -> dict[str, np.ndarray]:
    """The float32 weights an MLX folder stands for (what mlx-lm computes with), by HF name."""
    raw = {k: v for k, (v, _) in _read_st(folder / "model.safetensors").items()}
    cfg = json.loads((folder / "config.json").read_text())["quantization"]
    f32 = {k: (from_bf16(v) if v.dtype == np.uint16 else v.astype(np.float32)) for k, v in raw.items()
           if v.dtype != np.uint32}
    out = {}
    for name, v in raw.items():
        if name.endswith((".scales", ".biases")):
            continue
        if v.dtype == np.uint32:
            module = name[: -len(".weight")]
            o = cfg.get(module)
            b, g = (o["bits"], o["group_size"]) if isinstance(o, dict) else (cfg["bits"], cfg["group_size"])
            v = dequantize_affine(AffineTensor(v, f32[module + ".scales"], f32[module + ".biases"], b, g))
        else:
            v = f32[name]
        out[name[len(prefix):]] = v
    return out


def _matrix(t) -> np.ndarray:
    return dequantize_affine(t) if isinstance(t, AffineTensor) else t.dequantize()


def _build_tiny(kind: str, root: Path) -> tuple[str, Path, dict[str, np.ndarray], Path]:
    """(arch, mlx folder, HF float weights as mlx-lm would compute with them, GGUF of the HF folder)."""
    hf = root / "hf"
    if kind.startswith("gemma"):
        make_gemma3(hf, multimodal=kind.endswith("multimodal"), gemma2=kind == "gemma2")
        gguf = write_gguf_unquantized(hf, root / "ref.gguf")
        write_tokenizer_files(read_gguf(gguf).metadata, hf)  # mlx-community folders carry tokenizer.json
        prefix = "language_model.model." if kind.endswith("multimodal") else "model."
        weights = {k[len(prefix):]: from_bf16(v) for k, (v, _) in _read_st(hf / "model.safetensors").items()
                   if k.startswith(prefix)}
        overrides = {prefix + "layers.2.mlp.down_proj": {"bits": 8, "group_size": 64}}
        _mlxify(hf, root / "mlx", weights, prefix, "bfloat16", overrides=overrides)
        return kind.split("-")[0], root / "mlx", _dequantized_reference(root / "mlx", prefix), gguf
    weights = make_hf_model(hf, kind, seed=3)
    gguf = write_gguf_unquantized(hf, root / "ref.gguf")
    weights.pop("model.layers.0.self_attn.rotary_emb.inv_freq", None)
    # A per-module override and a module mlx-lm left dense, as mixed-precision recipes write them.
    overrides = {"model.layers.0.mlp.down_proj": {"bits": 8, "group_size": 64},
                 "model.layers.1.self_attn.v_proj": False}
    _mlxify(hf, root / "mlx", weights, "", "float16" if kind == "qwen2" else "bfloat16", overrides=overrides)
    return kind, root / "mlx", _dequantized_reference(root / "mlx"), gguf


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "granite", "olmo2", "gemma3", "gemma3-multimodal",
                                                 "gemma2"])
def tiny(request, tmp_path_factory):
    return _build_tiny(request.param, tmp_path_factory.mktemp(request.param))


def test_tiny_folder_loads_like_the_converted_checkpoint(tiny):
    arch, folder, ref, gguf = tiny
    m, g = load_model(folder), load_model(gguf)
    assert m.format == "mlx" and m.path == folder
    assert m.config == g.config.__class__(**{**g.config.__dict__, "name": folder.name})
    w = m.weights
    gemma = arch.startswith("gemma")
    prefix = "" if gemma else "model."
    n_head, n_kv = m.config.n_head, m.config.n_head_kv
    perm = (lambda x, n: permute_rope_rows(x, n)) if arch in ("llama", "granite") else (lambda x, n: x)
    layer = w.layers[2 if gemma else 0]
    i = 2 if gemma else 0
    p = f"{prefix}layers.{i}."
    np.testing.assert_array_equal(_matrix(layer.wq), perm(ref[p + "self_attn.q_proj.weight"], n_head))
    np.testing.assert_array_equal(_matrix(layer.wk), perm(ref[p + "self_attn.k_proj.weight"], n_kv))
    np.testing.assert_array_equal(_matrix(layer.w_down), ref[p + "mlp.down_proj.weight"])
    assert isinstance(layer.w_down, AffineTensor) and layer.w_down.bits == 8 and layer.w_down.group_size == 64
    assert isinstance(layer.w_up, AffineTensor) and layer.w_up.bits == 4
    np.testing.assert_array_equal(_matrix(w.token_embd), ref[f"{prefix}embed_tokens.weight"])
    if gemma:
        np.testing.assert_array_equal(layer.post_ffn_norm, ref[p + "post_feedforward_layernorm.weight"] + 1)
        assert w.output is w.token_embd
    else:  # olmo2's post_attention_layernorm follows attention; the others' precedes the FFN
        norm = layer.post_attn_norm if arch == "olmo2" else layer.ffn_norm
        np.testing.assert_array_equal(norm, ref[p + "post_attention_layernorm.weight"])
        assert not isinstance(w.layers[1].wv, AffineTensor)  # left dense by its override
        np.testing.assert_array_equal(_matrix(w.layers[1].wv), ref["model.layers.1.self_attn.v_proj.weight"])
    if arch == "qwen2":
        np.testing.assert_array_equal(layer.bq, ref[p + "self_attn.q_proj.bias"])
    if arch == "qwen3":
        np.testing.assert_array_equal(layer.q_norm, ref[p + "self_attn.q_norm.weight"])


def test_tiny_folder_tokenizer(tiny):
    """tokenizer.json through HFTokenizer tokenizes as the converted GGUF's tokenizer (llama.cpp's)."""
    arch, folder, _, gguf = tiny
    ours = HFTokenizer.from_folder(folder, n_vocab=load_model(folder).config.n_vocab)
    ref = Tokenizer.from_metadata(read_gguf(gguf).metadata)
    for text in SAMPLES + ["<|im_start|>user\nhi<|im_end|>", "<start_of_turn>user\nhi<end_of_turn>"]:
        for add_special in (True, False):
            for parse_special in (True, False):
                assert ours.encode(text, add_special, parse_special) == ref.encode(text, add_special, parse_special), text
        ids = ref.encode(text, True, True)
        assert ours.decode(ids) == ref.decode(ids) and ours.decode(ids, True) == ref.decode(ids, True)
    assert ours.eog_ids == ref.eog_ids and ours.add_bos == ref.add_bos
    if ref.add_bos:
        assert ours.bos_id == ref.bos_id


def test_tiny_folder_logits_match_numpy_reference(tiny):
    """The MLX backend on the loaded folder computes the HF model's logits (numpy reference run on
    the dequantized weights), so the name mapping and the Q/K / norm transforms are right."""
    mlx_backend = pytest.importorskip("infer.backends.mlx.runner")
    from infer.backends.batch import Batch

    arch, folder, ref, _ = tiny
    m = load_model(folder)
    runner = mlx_backend.MlxRunner(m.config, m.weights)
    ids = [3, 17, 42, 8, 99, 5, 23, 61, 11, 7, 30, 2]
    bs = 16
    pool = runner.new_kv_pool([1] * len(m.config.kv_groups), bs)
    tables = [np.zeros((1, 1), np.int32) for _ in m.config.kv_groups]
    got = np.array(runner.forward_batch(Batch.single(np.array(ids), 0, tables, bs, all_logits=True), pool))
    want = gemma3_forward(ref, ids, arch == "gemma2") if arch.startswith("gemma") else hf_forward(ref, arch, ids)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 2e-2, err
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.9


# ----------------------------------------------------------------------------- errors


@pytest.mark.e2e
def test_folder_errors(tmp_path):
    _, folder, _, _ = _build_tiny("qwen3", tmp_path / "src")
    cases = {}
    for case in ("no-config", "bad-type", "no-tensor", "no-tokenizer", "no-biases", "bad-shape"):
        d = tmp_path / case
        shutil.copytree(folder, d)
        cases[case] = d
    (cases["no-config"] / "config.json").unlink()
    cfg = json.loads((folder / "config.json").read_text())
    (cases["bad-type"] / "config.json").write_text(json.dumps({**cfg, "model_type": "mamba"}))
    (cases["no-tokenizer"] / "tokenizer.json").unlink()
    raw = _read_st(folder / "model.safetensors")
    write_safetensors(cases["no-tensor"] / "model.safetensors",
                      {k: v for k, v in raw.items() if not k.startswith("model.layers.1.mlp.up_proj")})
    write_safetensors(cases["no-biases"] / "model.safetensors",
                      {k: v for k, v in raw.items() if k != "model.layers.0.mlp.up_proj.biases"})
    scales, dtype = raw["model.layers.0.mlp.up_proj.scales"]
    write_safetensors(cases["bad-shape"] / "model.safetensors",
                      {**raw, "model.layers.0.mlp.up_proj.scales": (scales[:, :-1].copy(), dtype)})
    expect = {"no-config": "no config.json", "bad-type": "unsupported model_type 'mamba'",
              "no-tensor": "missing tensor 'blk.1.ffn_up.weight'", "no-tokenizer": "no tokenizer.json",
              "no-biases": "no biases", "bad-shape": "do not fit 4-bit groups of 32"}
    for case, msg in expect.items():
        with pytest.raises(ModelLoadError, match=msg) as e:
            load_model(cases[case])
        assert "\n" not in str(e.value) and str(cases[case]) in str(e.value)
    for case in ("no-tensor", "bad-type"):
        assert_one_line_error(infer("run", str(cases[case]), "hi", "--max-tokens", "1"), expect[case])


# ----------------------------------------------------------------------------- the embedded Gemma


@pytest.fixture(scope="module")
def gemma_gguf(gemma_path):
    return load_model(gemma_path)


@pytest.fixture(scope="module")
def gemma_mlx(gemma_path, tmp_path_factory):
    """The embedded Gemma as MLX folders: 8-bit written in process, 4-bit through the CLI."""
    root = tmp_path_factory.mktemp("gemma-mlx")
    s8 = export_mlx(gemma_path, root / "g8", MlxExportOptions(bits=8), write_tokenizer_files)
    r = infer("quantize", str(gemma_path), str(root / "g4"), "--format", "mlx", "--bits", "4")
    assert r.returncode == 0, r.stderr
    assert "MLX 4-bit, group size 64, bfloat16" in r.stderr and "already quantized" in r.stderr
    print(f"export 8-bit: {s8.seconds:.1f} s, {s8.bytes_after / 2**20:.1f} MiB; 4-bit via CLI: {r.stderr.strip()}")
    return {8: root / "g8", 4: root / "g4"}


@pytest.mark.e2e
@pytest.mark.parametrize("bits", [8, 4])
def test_gemma_export_round_trip(gemma_mlx, gemma_gguf, bits):
    folder = gemma_mlx[bits]
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
        "tokenizer.json", "tokenizer_config.json"]
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["model_type"] == "gemma3_text" and cfg["quantization"] == {"group_size": 64, "bits": bits, "mode": "affine"}
    header = read_safetensors_names(folder / "model.safetensors")
    assert header["model.embed_tokens.weight"] == "U32" and header["model.embed_tokens.scales"] == "BF16"
    assert header["model.layers.0.pre_feedforward_layernorm.weight"] == "BF16" and "lm_head.weight" not in header
    m = load_model(folder)
    g = gemma_gguf
    assert m.config == g.config.__class__(**{**g.config.__dict__, "name": folder.name})
    # Every matrix within the affine error of the source.
    pairs = [(m.weights.token_embd, g.weights.token_embd, slice(0, 4096))]
    for i in (0, 9, 17):
        a, b = m.weights.layers[i], g.weights.layers[i]
        pairs += [(getattr(a, n), getattr(b, n), slice(None)) for n in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")]
        for n in ("attn_norm", "q_norm", "k_norm", "post_attn_norm", "ffn_norm", "post_ffn_norm"):
            np.testing.assert_array_equal(getattr(a, n), getattr(b, n))  # bfloat16 (w - 1) is exact here
    for t, src, rows in pairs:
        _assert_affine_error(dequantize_affine(t, rows), src.dequantize()[rows], bits, 64)
    np.testing.assert_array_equal(m.weights.output_norm, g.weights.output_norm)


def _assert_affine_error(got: np.ndarray, x: np.ndarray, bits: int, group_size: int) -> None:
    """got within MLX's affine error of x, group by group: half a step (a whole one at the far end,
    which the exactly-represented edge can push past the last code), plus the bfloat16 rounding of
    scale and bias."""
    n_bins = (1 << bits) - 1
    grp = x.reshape(x.shape[0], -1, group_size)
    step = (grp.max(-1) - grp.min(-1)) / n_bins
    bound = step * (1 + n_bins * 2.0 ** -8) + np.abs(grp).max(-1) * 2.0 ** -8 + 1e-7
    err = np.abs(got.reshape(grp.shape) - grp).max(-1)
    assert (err <= bound).all(), float((err - bound).max())


def test_hf_folder_exports_to_mlx(tiny, tmp_path):
    """An HF checkpoint folder in: HF names and conventions out (llama Q/K rows back in HF order,
    Gemma norms as w - 1), its own tokenizer files copied; loads back like the converted GGUF."""
    arch, _, _, gguf = tiny
    hf = gguf.parent / "hf"
    out = tmp_path / "out"
    export_mlx(hf, out, MlxExportOptions(bits=8, group_size=32), write_tokenizer_files)
    names = read_safetensors_names(out / "model.safetensors")
    assert names["model.layers.0.self_attn.q_proj.weight"] == "U32" and "model.norm.weight" in names
    assert (out / "tokenizer.json").read_bytes() == (hf / "tokenizer.json").read_bytes()
    m, g = load_model(out), load_model(gguf)
    assert m.config == g.config.__class__(**{**g.config.__dict__, "name": out.name})
    for a, b in zip(m.weights.layers, g.weights.layers):
        for n in ("wq", "wk", "w_down"):
            _assert_affine_error(dequantize_affine(getattr(a, n)), getattr(b, n).dequantize(), 8, 32)
        for n in ("attn_norm", "post_attn_norm"):  # olmo2 has only the second
            if getattr(b, n) is not None:
                np.testing.assert_allclose(getattr(a, n), getattr(b, n), rtol=2.0 ** -8)


def read_safetensors_names(path: Path) -> dict[str, str]:
    return {k: e.dtype for k, e in read_safetensors_header(path).items()}


@pytest.mark.e2e
def test_gemma_tokenizer_json_is_the_gguf_tokenizer(gemma_mlx, gemma_gguf):
    """The written tokenizer.json tokenizes the prompts exactly as the GGUF's tokenizer, with and
    without BOS and special-token parsing, through infer's HFTokenizer and the bare `tokenizers`
    library (as mlx-lm / transformers would use it); decodes alike; same template rendering."""
    from tokenizers import Tokenizer as RawTokenizer

    from infer.engine.chat_template import load_chat_template

    folder = gemma_mlx[4]
    ref = Tokenizer.from_metadata(gemma_gguf.metadata)
    ours = HFTokenizer.from_folder(folder, n_vocab=gemma_gguf.config.n_vocab)
    raw = RawTokenizer.from_file(str(folder / "tokenizer.json"))
    texts = PROMPTS + ["<bos>a<eos><pad>", "<unused7> <b>x</b>  \t\t y\n\n\n", "\u2581 ▁▁x", "<0x41>"]
    for text in texts:
        for add_special in (True, False):
            for parse_special in (True, False):
                assert ours.encode(text, add_special, parse_special) == ref.encode(text, add_special, parse_special), text
        ids = ref.encode(text, True, True)
        assert raw.encode(text, add_special_tokens=True).ids == ids, text
        assert ours.decode(ids) == ref.decode(ids) and ours.decode(ids, True) == ref.decode(ids, True), text
        detok = ours.detokenizer()
        assert "".join(detok.add(t) for t in ids) + detok.flush() == ref.decode(ids)
    assert (ours.bos_id, ours.eos_id, ours.add_bos, ours.eog_ids) == (ref.bos_id, ref.eos_id, ref.add_bos, ref.eog_ids)
    assert ours.vocab_size == ref.vocab_size and ours.is_control(106) and not ours.is_control(107)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "2+2?"}]
    mine = load_chat_template(ours.chat_template, "gemma3", ours.model_type, ours.pre, ours.token_text(ours.bos_id), "")
    theirs = load_chat_template(ref.chat_template, "gemma3", ref.model_type, ref.pre, ref.token_text(ref.bos_id), "")
    assert mine.render(msgs) == theirs.render(msgs)
    gen = json.loads((folder / "generation_config.json").read_text())
    assert set(gen["eos_token_id"]) == set(ref.eog_ids)


@pytest.mark.e2e
def test_quantize_mlx_cli_errors_and_atomicity(gemma_path, gemma_mlx, tmp_path):
    out = tmp_path / "out"
    assert_one_line_error(infer("quantize", str(gemma_path), str(gemma_mlx[4]), "--format", "mlx"), "already exists")
    assert_one_line_error(infer("quantize", str(gemma_path), str(out), "--format", "mlx", "--group-size", "48"),
                          "--group-size must be one of 32, 64, 128")
    r = infer("quantize", str(gemma_path), str(out), "--format", "mlx", "--type", "Q8_0")
    assert r.returncode == 2 and "GGUF output only" in r.stderr

    class Interrupted(BaseException):
        pass

    def interrupt(i, n, name):
        if i == 50:
            raise Interrupted

    for target in (out, gemma_mlx[8]):  # a new folder; an existing one with force
        before = sorted(p.name for p in target.iterdir()) if target.exists() else None
        with pytest.raises(Interrupted):
            export_mlx(gemma_path, target, MlxExportOptions(bits=8, force=True), write_tokenizer_files, interrupt)
        assert (sorted(p.name for p in target.iterdir()) if target.exists() else None) == before
        assert not [p for p in target.parent.iterdir() if p.name.startswith(".")]  # no partial folder left


@pytest.mark.e2e
def test_gemma_mlx_folder_on_the_mlx_backend(gemma_path, gemma_mlx, gemma_gguf):
    """The 8-bit folder end to end: LLM picks the MLX backend and the folder's tokenizer; for each
    prompt the first-token logits are within the 8-bit error of an exact float64 pass over the
    GGUF's weights, and the first token is the cpu backend's, the exact argmax, or a near-tie.

    Identical 32-token continuations are not asserted: measured on all PROMPTS, the 8-bit folder
    agrees with the cpu backend on 8/24 (first tokens 20/24), but so does the MLX backend running
    the GGUF itself (9/24, 20/24): the cpu backend's int8 activations part from any float path
    within a few tokens. Against the exact reference the folder picks the argmax first token for
    22/24 prompts (the cpu backend 20/24)."""
    pytest.importorskip("infer.backends.mlx.runner")
    from helpers.exact_forward import exact_hidden, exact_logits
    from infer.engine.engine import EngineConfig
    from infer.engine.llm import LLM
    from infer.engine.sampler import SamplingParams

    llm = LLM.load(gemma_mlx[8], EngineConfig(n_ctx=256, n_threads=2))
    assert llm.backend == "mlx" and isinstance(llm.tokenizer, HFTokenizer)
    cpu = LLM.load(gemma_path, EngineConfig(n_ctx=256, n_threads=2, backend="cpu"))
    # MLX's CPU build runs quantized products as scalar loops (~0.1 s a prompt token here), so a
    # sample: the prompts whose first token differs between backends (7, 10, 11, 15, 21) and short others.
    sample = [PROMPTS[i] for i in (0, 4, 7, 8, 10, 11, 12, 15, 21)]
    prompts = [llm.tokenizer.encode(p, add_special=True, parse_special=True) for p in sample]
    assert prompts == [cpu.tokenizer.encode(p, add_special=True, parse_special=True) for p in sample]
    assert llm.encode_chat([{"role": "user", "content": "Hi"}]) == cpu.encode_chat([{"role": "user", "content": "Hi"}])
    g = gemma_gguf
    exact = exact_logits(g.config, g.weights, np.stack([h[-1] for h in exact_hidden(
        g.config, g.weights, [np.array(p) for p in prompts])]))
    ours, theirs = _last_logits(llm.runner, llm.model.config, prompts), _last_logits(cpu.runner, g.config, prompts)
    same_cpu = same_exact = 0
    worst = 0.0
    for o, t, ref in zip(ours, theirs, exact):
        scale = np.abs(ref).max()
        worst = max(worst, np.abs(o - ref).max() / scale)
        tok = int(o.argmax())
        same_cpu += tok == t.argmax()
        same_exact += tok == ref.argmax()
        assert tok in (t.argmax(), ref.argmax()) or ref.max() - ref[tok] < 0.01 * scale
    print(f"8-bit MLX folder: first tokens = cpu {same_cpu}/{len(prompts)}, = exact argmax {same_exact}; "
          f"max |logit - exact| {worst:.2%} of max |logit|")
    assert worst < 0.07  # measured 4.8%; the cpu backend's own int8 path: 2.3-6%
    # The whole serving path: engine, streaming detokenizer of the folder's tokenizer.
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    events = list(llm.generate(prompts[0], params))
    assert "".join(e.text for e in events) == llm.tokenizer.decode(events[-1].token_ids)
    assert events[-1].token_ids[0] == int(ours[0].argmax())


def _last_logits(runner, cfg, seqs: list[list[int]], bs: int = 16) -> np.ndarray:
    """Each sequence's last-token logits from one batched forward pass (own blocks per sequence)."""
    from infer.backends.batch import Batch

    nbs = [(len(s) + bs - 1) // bs for s in seqs]
    tables = np.full((len(seqs), max(nbs)), -1, np.int32)
    start = np.cumsum([0] + nbs)
    for i, nb in enumerate(nbs):
        tables[i, :nb] = np.arange(start[i], start[i] + nb)
    pos = np.concatenate([np.arange(len(s)) for s in seqs]).astype(np.int32)
    tok_seq = np.concatenate([np.full(len(s), i) for i, s in enumerate(seqs)]).astype(np.int32)
    slot = (tables[tok_seq, pos // bs] * bs + pos % bs).astype(np.int32)
    groups = len(cfg.kv_groups)
    batch = Batch(np.concatenate(seqs).astype(np.int32), pos, tok_seq, np.stack([slot] * groups), [tables] * groups,
                  (np.cumsum([len(s) for s in seqs]) - 1).astype(np.int32), np.arange(len(seqs), dtype=np.int64))
    pool = runner.new_kv_pool([int(start[-1])] * groups, bs)
    return np.array(runner.forward_batch(batch, pool), dtype=np.float64)


@pytest.mark.parametrize("arch", ["smollm3", "mistral3"])
def test_per_layer_rope_and_attention_temperature_survive_an_export(arch, tmp_path):
    """What config.json must carry beyond llama's: smollm3's layers without RoPE (no_rope_layers),
    mistral3's YaRN betas, log multiplier and attention temperature (Ministral 3's rope_parameters
    under its model_type): the folder loads back to the GGUF's config."""
    gguf = write_tiny_model(tmp_path / f"{arch}.gguf", arch, seed=3, chat_template="[INST]{{ messages[0].content }}")
    export_mlx(gguf, tmp_path / "out", MlxExportOptions(bits=8, group_size=32), write_tokenizer_files)
    m, g = load_model(tmp_path / "out"), load_model(gguf)
    assert m.config == g.config.__class__(**{**g.config.__dict__, "name": "out"})
    assert any(g.config.layer_nope) if arch == "smollm3" else g.config.attn_temp_scale and g.config.yarn_log_mul
