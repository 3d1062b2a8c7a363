"""llama.cpp's own server tests (tools/server/tests/unit) against `infer serve` and llama-server.

    python scripts/llama_server_tests.py                         # both servers, every file
    python scripts/llama_server_tests.py --server infer unit/test_tokenize.py unit/test_basic.py
    python scripts/llama_server_tests.py --report                # the table of the last runs only

The suite comes from llama-cpp-python's sdist (its vendor/llama.cpp), downloaded once as
scripts/build_llama_bench.sh gets it, into $INFER_BENCH_CACHE (else ~/.cache/infer-bench); each
run copies it to a temporary folder and runs pytest there, one test file at a time, with this
file as a plugin (-p).  Nothing of llama.cpp's is kept in this repository.  The plugin:

- points every ServerPreset (tinyllama2, bert_bge_small, ...) at one model, the embedded Gemma
  (--model: another GGUF); a test that asks for another model (a Hugging Face repo, a URL: vision,
  LoRA, draft models) fails at once on both servers instead of reaching the network;
- with --server infer, replaces ServerProcess.start: `infer serve` with the closest flags (the
  table INFER_FLAGS; a flag this infer's `serve --help` lacks is left out and noted in the
  results), waits for /health; llama.cpp's stop() ends it.  With --server llama it runs the
  native llama-server that scripts/build_llama_bench.sh builds (not rebuilt here);
- gives each test a deadline (--test-timeout) and each file one more.

Results: OUT/results-SERVER.json (per test: pass, fail or skip and the failure's first
line; reruns of some files update it) and OUT/results.md (the table and the summary: of the
tests that pass on llama-server, how many pass on infer).  Slow tests (pytest -m slow: other
models from Hugging Face) are left out unless --slow.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODEL_ENV = "INFER_SUITE_MODEL"  # what the plugin reads, set by the runner
SERVER_ENV = "INFER_SUITE_SERVER"
LLAMA_ENV = "INFER_SUITE_LLAMA_SERVER"
NOTES_ENV = "INFER_SUITE_NOTES"
TIMEOUT_ENV = "INFER_SUITE_TEST_TIMEOUT"
REUSE_ENV = "INFER_SUITE_REUSE"
THREADS = 1  # each server's threads (both): the tests check answers, not speed

# ServerProcess attribute -> infer serve's flag (None: no counterpart; a set value is noted).
# Booleans map to the flag alone.  Attributes the tests leave at their defaults are not listed.
INFER_FLAGS: dict[str, str | None] = {
    "n_ctx": "--ctx", "n_slots": "--parallel", "n_ubatch": "--ubatch-size", "n_threads": "--threads",
    "api_key": "--api-key", "model_alias": "--alias", "pooling": "--pooling", "ctk": "-ctk", "ctv": "-ctv",
    "reasoning_format": "--reasoning-format", "chat_template": "--chat-template",
    "chat_template_file": "--chat-template-file", "n_predict": "--n-predict", "no_ui": "--no-webui",
    "cors_origins": "--cors", "model_draft": "--draft", "spec_draft_n_max": "--draft-max",
    "spec_draft_n_min": "--draft-min", "server_slots": "--slots", "server_metrics": "--metrics",
    "server_embeddings": "--embedding", "server_reranking": "--reranking", "jinja": "--jinja",
    "reasoning": "--reasoning", "slot_save_path": "--slot-save-path", "enable_ctx_shift": "--context-shift",
    "n_batch": "--batch-size", "fa": None, "n_gpu_layer": None, "kv_unified": None, "swa_full": None,
    "lora_files": None, "n_ga": None, "n_ga_w": None, "spec_type": None, "sleep_idle_seconds": None,
    "cache_ram": None, "no_cache_idle_slots": None, "models_dir": None, "models_max": None,
    "models_preset": None, "no_models_autoload": None, "media_path": None, "ui_mcp_proxy": None,
    "backend_sampling": None, "gcp_compat": None, "server_tools": None, "server_tools_runtime": None,
    "mcp_servers_config": None, "mcp_servers_json": None, "model_tags": None,
    "server_continuous_batching": None,  # infer always batches continuously
}


def cache_dir() -> Path:
    """build_llama_bench.sh's cache: $INFER_BENCH_CACHE, else ~/.cache/infer-bench."""
    if os.environ.get("INFER_BENCH_CACHE"):
        return Path(os.environ["INFER_BENCH_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "infer-bench"


def llama_cpp_python_version() -> str:
    import importlib.metadata
    return os.environ.get("LLAMA_CPP_PYTHON_VERSION") or importlib.metadata.version("llama-cpp-python")


def suite_dir(version: str) -> Path:
    """tools/server/tests of the sdist's llama.cpp, extracted once into the cache."""
    dest = cache_dir() / f"llama.cpp-{version}-server-tests"
    if (dest / "utils.py").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        "-d", tmp, f"llama-cpp-python=={version}"], check=True)
        prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/tools/server/tests/"
        with tarfile.open(Path(tmp) / f"llama_cpp_python-{version}.tar.gz") as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
            tar.extractall(tmp, members=members, filter="data")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(Path(tmp) / prefix, dest)
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_pytest(tests: Path, targets: list[str], server: str, env: dict[str, str], args, out: Path,
               tag: str, reuse: bool) -> dict:
    """Some tests on one server in a fresh pytest; returns {test id: {outcome, message}}."""
    xml = out / f"junit-{server}-{tag}.xml"
    xml.unlink(missing_ok=True)
    env = {**env, SERVER_ENV: server, NOTES_ENV: str(out / f"notes-{server}.jsonl"), "PORT": str(free_port()),
           REUSE_ENV: "1" if reuse else "0"}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "llama_server_tests", "-q",
           "-o", "addopts=", f"--junitxml={xml}", *targets]
    if not args.slow:
        cmd += ["-m", "not slow"]
    if args.k:
        cmd += ["-k", args.k]
    with open(out / f"log-{server}-{tag}.txt", "w") as f:
        try:
            subprocess.run(cmd, cwd=tests, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=args.file_timeout)
        except subprocess.TimeoutExpired:
            f.write(f"\n*** the run went past {args.file_timeout} s\n")
    results: dict[str, dict] = {}
    if not xml.exists():
        return results
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "")
        outcome, message = "pass", ""
        for tag_name, kind in (("failure", "fail"), ("error", "fail"), ("skipped", "skip")):
            node = case.find(tag_name)
            if node is not None:
                outcome = kind
                lines = (node.get("message") or node.text or "").strip().splitlines()
                message = lines[0][:300] if lines else ""
                break
        if name in results and outcome == "pass":
            continue  # an error in teardown after a pass is reported as a second testcase
        results[name] = {"outcome": outcome, "message": message}
    return results


def run_file(tests: Path, test_file: str, server: str, env: dict[str, str], args, out: Path) -> dict:
    """A test file on one server; with --reuse, its failures again, each test on fresh servers."""
    stem = Path(test_file).stem
    results = run_pytest(tests, [test_file], server, env, args, out, stem, args.reuse)
    # A missing route (404) or model does not depend on what earlier tests left in a shared server.
    failed = [n for n, r in results.items() if r["outcome"] == "fail"
              and not any(s in r["message"] for s in ("needs another model", "404 =="))]
    if args.reuse and failed:
        results.update(run_pytest(tests, failed, server, env, args, out, stem + "-fresh", False))
    return results


def report(out: Path) -> str:
    data = {server: json.loads(p.read_text()) if (p := out / f"results-{server}.json").exists() else {}
            for server in ("infer", "llama")}
    infer, llama = data["infer"], data["llama"]
    names = sorted(set(infer) | set(llama))
    mark = {"pass": "pass", "fail": "FAIL", "skip": "skip", None: "-"}
    rows = ["| test | llama-server | infer | infer's failure |", "|---|---|---|---|"]
    for n in names:
        i, ll = infer.get(n, {}), llama.get(n, {})
        why = i.get("message", "").replace("|", "\\|") if i.get("outcome") == "fail" else ""
        rows.append(f"| {n} | {mark[ll.get('outcome')]} | {mark[i.get('outcome')]} | {why[:160]} |")
    llama_pass = {n for n in names if llama.get(n, {}).get("outcome") == "pass"}
    both = {n for n in llama_pass if infer.get(n, {}).get("outcome") == "pass"}
    infer_pass = {n for n in names if infer.get(n, {}).get("outcome") == "pass"}
    unrun = {n for n in llama_pass if n not in infer}
    summary = (f"{len(names)} tests; llama-server passes {len(llama_pass)}, infer {len(infer_pass)}; "
               f"of llama-server's {len(llama_pass)}, infer passes {len(both)} and fails "
               f"{len(llama_pass - both - unrun)}" + (f" ({len(unrun)} not run on infer)" if unrun else "") +
               f"; infer passes {len(infer_pass - llama_pass)} that llama-server does not.")
    (out / "results.md").write_text(summary + "\n\n" + "\n".join(rows) + "\n")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="test files under unit/ (default: all)")
    ap.add_argument("--server", choices=["infer", "llama", "both"], default="both")
    ap.add_argument("--model", help="the GGUF every preset serves (default: the embedded model)")
    ap.add_argument("--llama-server", help="llama-server binary (default: build_llama_bench.sh's)")
    ap.add_argument("--out", default="llama-server-tests", help="results folder")
    ap.add_argument("--test-timeout", type=int, default=120, help="seconds per test")
    ap.add_argument("--file-timeout", type=int, default=3600, help="seconds per test file")
    ap.add_argument("-k", help="pytest -k expression")
    ap.add_argument("--slow", action="store_true", help="also the slow tests (other models: they fail offline)")
    ap.add_argument("--reuse", action="store_true",
                    help="tests with the same server options share one server; failures rerun on fresh ones")
    ap.add_argument("--report", action="store_true", help="only rewrite results.md from the results-*.json")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.report:
        print(report(out))
        return
    version = llama_cpp_python_version()
    if args.model:
        model = str(Path(args.model).resolve())
    else:
        from infer.models.default import default_model_path
        model = str(default_model_path())
    llama_bin = args.llama_server or str(cache_dir() / f"llama.cpp-{version}" / "bin" / "llama-server")
    servers = ["llama", "infer"] if args.server == "both" else [args.server]
    if "llama" in servers and not os.access(llama_bin, os.X_OK):
        sys.exit(f"no llama-server at {llama_bin}: run scripts/build_llama_bench.sh")
    with tempfile.TemporaryDirectory(prefix="llama-server-tests-") as tmp:
        tests = Path(tmp) / "tests"
        shutil.copytree(suite_dir(version), tests)
        (tests / "tmp").mkdir(exist_ok=True)
        files = args.files or sorted(f"unit/{p.name}" for p in (tests / "unit").glob("test_*.py"))
        env = {**os.environ, MODEL_ENV: model, LLAMA_ENV: llama_bin, TIMEOUT_ENV: str(args.test_timeout),
               "PYTHONPATH": os.pathsep.join([str(tests), str(HERE), os.environ.get("PYTHONPATH", "")]),
               "HF_HUB_OFFLINE": "1", "LLAMA_CACHE": str(tests / "tmp"), "NO_PROXY": "*"}
        for server in servers:
            for f in files:
                started = time.time()
                res = run_file(tests, f, server, env, args, out)
                counts = {k: sum(r["outcome"] == k for r in res.values()) for k in ("pass", "fail", "skip")}
                print(f"{server:6} {f}: {counts} in {time.time() - started:.0f} s", flush=True)
                path = out / f"results-{server}.json"
                bucket = json.loads(path.read_text()) if path.exists() else {}
                bucket = {n: r for n, r in bucket.items() if not n.startswith(f + "::")}
                bucket.update(res)
                path.write_text(json.dumps(bucket, indent=1, sort_keys=True))
    print(report(out))


# ---- the pytest plugin (loaded with -p llama_server_tests inside the copied suite) ----

def _infer_help_flags() -> set[str]:
    text = subprocess.run([sys.executable, "-m", "infer.cli", "serve", "--help"], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"}).stdout
    return {w.strip("│,") for w in text.split() if w.startswith("-")}


def _note(server: str, message: str) -> None:
    path = os.environ.get(NOTES_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
                                "server": server, "note": message}) + "\n")


def _needs_other_model(server) -> str | None:
    for attr in ("model_hf_repo", "model_hf_file", "model_url", "mmproj_url"):
        if getattr(server, attr, None):
            return f"{attr}={getattr(server, attr)}"
    return None


def _infer_args(server, flags: set[str]) -> tuple[list[str], list[str]]:
    """`infer serve`'s command line for this ServerProcess, and the options left out."""
    cmd = [sys.executable, "-m", "infer.cli", "serve"]
    if server.model_file:
        cmd.append(server.model_file)
    cmd += ["--host", server.server_host, "--port", str(server.server_port), "--shutdown-timeout", "1"]
    dropped = []
    for attr, flag in INFER_FLAGS.items():
        value = getattr(server, attr, None)
        if value is None or value is False or value == 0 and attr == "enable_ctx_shift":
            continue
        if flag is None or flag not in flags:
            dropped.append(f"{attr}={value}")
            continue
        if value is True:
            cmd.append(flag)
        elif attr == "cors_origins":
            for origin in str(value).split(","):
                cmd += [flag, origin.strip()]
        elif attr == "lora_files":
            dropped.append(f"{attr}={value}")
        else:
            cmd += [flag, str(value)]
    if getattr(server, "cors_origins", None) is None:  # llama-server's default answers any origin; infer's the loopback ones
        cmd += ["--cors", "*"]
    if server.no_ui and "--no-webui" not in cmd:
        dropped.append("no_ui")
    return cmd, dropped


def _start_infer(self, timeout_seconds: int = 60) -> None:
    import requests
    import utils
    flags = getattr(utils, "_infer_flags", None)
    if flags is None:
        flags = utils._infer_flags = _infer_help_flags()
    other = _needs_other_model(self)
    if other:
        raise RuntimeError(f"needs another model ({other}); the suite runs offline on one model")
    cmd, dropped = _infer_args(self, flags)
    if dropped:
        _note("infer", "left out: " + ", ".join(dropped))
    print("tests: starting infer with:", " ".join(cmd))
    self._log = open(self.log_path, "w") if self.log_path else sys.stdout
    self.process = subprocess.Popen(cmd, stdout=self._log, stderr=self._log)
    utils.server_instances.add(self)
    deadline = time.time() + max(timeout_seconds, 120)  # a cold numba cache compiles first
    headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
    while time.time() < deadline:
        try:
            if requests.get(self.make_url("/health"), headers=headers, timeout=2).status_code == 200:
                self.ready = True
                return
        except requests.RequestException:
            pass
        if self.process.poll() is not None:
            raise RuntimeError(f"infer serve exited with {self.process.returncode}")
        time.sleep(0.05)
    raise TimeoutError(f"infer serve did not start within {timeout_seconds} s")


def _patch_utils() -> None:
    import utils
    model = os.environ[MODEL_ENV]
    server_kind = os.environ[SERVER_ENV]

    def preset(make):
        def made():
            server = make()
            if server.model_hf_repo or server.model_hf_file or server.model_file or server.model_url:
                server.model_hf_repo = server.model_hf_file = server.model_url = None
                server.model_file = model
            if server.n_threads is None:
                server.n_threads = THREADS  # llama.cpp's spinning threads crawl on a busy machine
            return server
        return staticmethod(made)

    for name, method in list(vars(utils.ServerPreset).items()):
        if isinstance(method, staticmethod) and name != "load_all":
            setattr(utils.ServerPreset, name, preset(method.__func__))
    utils.ServerPreset.load_all = staticmethod(lambda: None)  # the model is local: nothing to fetch first

    original_start = utils.ServerProcess.start

    def start_llama(self, timeout_seconds: int = utils.DEFAULT_HTTP_TIMEOUT) -> None:
        other = _needs_other_model(self)
        if other:
            raise RuntimeError(f"needs another model ({other}); the suite runs offline on one model")
        self.server_path = os.environ[LLAMA_ENV]
        original_start(self, timeout_seconds)

    start = _start_infer if server_kind == "infer" else start_llama
    if os.environ.get(REUSE_ENV) == "1":
        _reuse_servers(utils, start)
    else:
        utils.ServerProcess.start = start


def _server_key(server) -> str:
    skip = {"process", "_log", "ready", "external_server"}
    return json.dumps({k: v for k, v in sorted(vars(server).items()) if k not in skip}, default=str)


def _reuse_servers(utils, start) -> None:
    """--reuse: a server started with the same options by an earlier test serves the next one too
    (stop() leaves it running); the runner reruns every failure on fresh servers."""
    pool: dict[str, subprocess.Popen] = {}
    utils.reuse_pool = pool
    original_stop = utils.ServerProcess.stop

    def reusing_start(self, timeout_seconds: int = utils.DEFAULT_HTTP_TIMEOUT) -> None:
        key = _server_key(self)
        process = pool.get(key)
        if process is not None and process.poll() is None:
            self.process, self.ready = process, True
            utils.server_instances.add(self)
            return
        start(self, timeout_seconds)
        pool[key] = self.process

    def reusing_stop(self) -> None:
        if self.process is not None and self.process in pool.values() and self.process.poll() is None:
            utils.server_instances.discard(self)
            self.process = None
            return
        original_stop(self)

    utils.ServerProcess.start = reusing_start
    utils.ServerProcess.stop = reusing_stop


def pytest_unconfigure(config) -> None:
    if not os.environ.get(SERVER_ENV):
        return
    import utils
    for process in getattr(utils, "reuse_pool", {}).values():
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def _stub_wget() -> None:
    """utils.py imports wget (a test dependency not installed here); offline, no test downloads."""
    try:
        import wget  # noqa: F401
    except ImportError:
        import types
        stub = types.ModuleType("wget")

        def download(url, out=None):
            raise RuntimeError(f"offline: will not download {url}")
        stub.download = download  # type: ignore[attr-defined]
        sys.modules["wget"] = stub


def pytest_load_initial_conftests(early_config, parser, args) -> None:
    if os.environ.get(SERVER_ENV):
        _stub_wget()


def pytest_configure(config) -> None:
    if os.environ.get(SERVER_ENV):
        _patch_utils()


def _timeout(signum, frame):
    raise TimeoutError(f"the test ran past {os.environ.get(TIMEOUT_ENV)} s")


def pytest_runtest_setup(item) -> None:
    if os.environ.get(SERVER_ENV):
        signal.signal(signal.SIGALRM, _timeout)
        signal.alarm(int(os.environ.get(TIMEOUT_ENV, "120")))


def pytest_runtest_teardown(item, nextitem) -> None:
    if os.environ.get(SERVER_ENV):
        signal.alarm(0)


if __name__ == "__main__":
    main()
