"""A local stand-in for the Hugging Face Hub, speaking the protocol huggingface_hub uses to download.

Routes (as huggingface_hub 2.x calls them):
  GET  /api/models/{repo}[/revision/{rev}][?blobs=True]  repo info: sha, siblings (+ size, blobId, lfs when blobs)
  HEAD /{repo}/resolve/{rev}/{file}  small files: 200 with ETag (git blob sha1), X-Repo-Commit, Content-Length;
                                     LFS files: 302 to the "CDN" with X-Linked-Etag (sha256) and X-Linked-Size
  GET  /{repo}/resolve/{rev}/{file}  the same, with the content (small files) or the redirect (LFS)
  GET  /blobs/{sha256}               the "CDN": LFS content, with Range support (206)
The CDN is addressed as `localhost` while the Hub is `127.0.0.1`: a different host, as on the real Hub, so
huggingface_hub reads the file metadata off the 302 itself and drops the Authorization header for the blob.

Fault injection, per (repo, file):
  `cut_once`  the file's first whole-file GET stops halfway and closes the connection
  `corrupt`   the file is served with one byte flipped (its middle one)
  `stall`     every GET of the file stops halfway (or at once, for a Range past it) and then sends
              nothing, the connection open, for `stall_seconds`: a server that hangs, which only
              the client's read timeout (HF_HUB_DOWNLOAD_TIMEOUT) ends
  `faults`    scripted faults for the file's next GETs, one per GET, in order: ("cut", offset) closes the
              connection once the body reaches that byte of the file, ("stall", offset) stalls there
  `rate`      bytes per second for every body (None: as fast as it goes), so a client can be killed
              mid-download
and gated repos (401 GatedRepo without the right token).
Every request is logged in `requests` as (method, path, headers with lower-case names).
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".gguf", ".safetensors", ".bin", ".onnx", ".pt")


@dataclass
class FakeRepo:
    files: dict[str, bytes | Path]  # repo-relative name -> content, or a file on disk to serve
    gated: bool = False
    commit: str = ""
    _meta: dict[str, dict] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.commit = self.commit or hashlib.sha1(json.dumps(sorted(self.files)).encode()).hexdigest()
        for name, content in self.files.items():
            size = content.stat().st_size if isinstance(content, Path) else len(content)
            data_hash = hashlib.sha256()
            blob = hashlib.sha1(f"blob {size}\0".encode())
            for chunk in _chunks(content, 0, size):
                data_hash.update(chunk)
                blob.update(chunk)
            lfs = name.endswith(LFS_SUFFIXES)
            self._meta[name] = {"size": size, "sha256": data_hash.hexdigest(), "blob": blob.hexdigest(), "lfs": lfs}

    def sibling(self, name: str, blobs: bool) -> dict:
        if not blobs:
            return {"rfilename": name}
        m = self._meta[name]
        s = {"rfilename": name, "size": m["size"], "blobId": m["blob"]}
        if m["lfs"]:
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{m['sha256']}\nsize {m['size']}\n"
            s["blobId"] = hashlib.sha1(f"blob {len(pointer)}\0{pointer}".encode()).hexdigest()
            s["lfs"] = {"sha256": m["sha256"], "size": m["size"], "pointerSize": len(pointer)}
        return s


def _chunks(content: bytes | Path, start: int, end: int, size: int = 1 << 20):
    if isinstance(content, bytes):
        for i in range(start, end, size):
            yield content[i:min(i + size, end)]
        return
    with open(content, "rb") as f:
        f.seek(start)
        left = end - start
        while left > 0:
            chunk = f.read(min(size, left))
            if not chunk:
                return
            left -= len(chunk)
            yield chunk


class FakeHub:
    def __init__(self, repos: dict[str, FakeRepo], token: str = "hf_secret"):
        self.repos = repos
        self.token = token
        self.cut_once: set[tuple[str, str]] = set()  # (repo, file)
        self.corrupt: set[tuple[str, str]] = set()
        self.stall: set[tuple[str, str]] = set()
        self.faults: dict[tuple[str, str], list[tuple[str, int]]] = {}
        self.stall_seconds = 60.0
        self.rate: float | None = None
        self._lock = threading.Lock()  # handlers run in threads: each scripted fault goes to one GET
        self._closing = threading.Event()  # ends the stalls when the hub stops
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.cdn = f"http://localhost:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()

    def next_fault(self, key: tuple[str, str], start: int, size: int) -> tuple[str, int] | None:
        """The fault for a GET of the file from byte `start`: (kind, the file's byte where it strikes)."""
        with self._lock:
            if key in self.cut_once and start == 0:
                self.cut_once.discard(key)
                return "cut", size // 2
            if key in self.stall:
                return "stall", max(start, size // 2)
            if self.faults.get(key):
                return self.faults[key].pop(0)
        return None

    def blob_owner(self, sha256: str) -> tuple[str, str] | None:
        for repo_id, repo in self.repos.items():
            for name, m in repo._meta.items():
                if m["sha256"] == sha256:
                    return repo_id, name
        return None

    def fetched(self, name: str) -> list[str]:
        """Paths of the GET requests that carried content for a file name (resolve or blob)."""
        out = []
        for method, path, _ in self.requests:
            if method != "GET":
                continue
            if path.endswith("/" + name):
                out.append(path)
            elif path.startswith("/blobs/"):
                owner = self.blob_owner(path.split("/")[2].split("?")[0])
                if owner and owner[1] == name:
                    out.append(path)
        return out


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+?)(?:/revision/(?P<rev>[^/]+))?$")


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def handle(self) -> None:
            try:
                super().handle()
            except (ConnectionResetError, BrokenPipeError):
                pass  # a client killed while its connection was open: no traceback on the hub's stderr

        def do_HEAD(self) -> None:
            self._route(head=True)

        def do_GET(self) -> None:
            self._route(head=False)

        def _route(self, head: bool) -> None:
            hub.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
            url = urlsplit(self.path)
            path = unquote(url.path)
            if m := _API.match(path):
                return self._api(m.group("repo"), m.group("rev") or "main", "blobs=true" in url.query.lower())
            if m := _RESOLVE.match(path):
                return self._resolve(m.group("repo"), unquote(m.group("rev")), m.group("file"), head)
            if path.startswith("/blobs/"):
                return self._blob(path.split("/")[2], head)
            self._error(404, "EntryNotFound", "no such route")

        def _repo(self, repo_id: str, rev: str) -> FakeRepo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound", "Repository not found")
            elif rev not in ("main", repo.commit):
                self._error(404, "RevisionNotFound", "Invalid rev id", commit=None)
                return None
            return repo

        def _authorized(self) -> bool:
            return self.headers.get("Authorization") == f"Bearer {hub.token}"

        def _api(self, repo_id: str, rev: str, blobs: bool) -> None:
            repo = self._repo(repo_id, rev)
            if repo is None:
                return
            # As on the real Hub, a gated repo's info is public; its files are not.
            body = json.dumps({
                "_id": repo.commit[:24], "id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False,
                "gated": "manual" if repo.gated else False, "disabled": False, "tags": [],
                "lastModified": "2025-01-01T00:00:00.000Z",
                "siblings": [repo.sibling(n, blobs) for n in repo.files],
            }).encode()
            self._send(200, body, {"Content-Type": "application/json", "X-Repo-Commit": repo.commit}, head=False)

        def _resolve(self, repo_id: str, rev: str, name: str, head: bool) -> None:
            repo = self._repo(repo_id, rev)
            if repo is None:
                return
            if repo.gated and not self._authorized():
                return self._error(401, "GatedRepo", "Access to model is restricted. You must have access to it "
                                   "and be authenticated to access it. Please log in.", commit=repo.commit)
            if name not in repo.files:
                return self._error(404, "EntryNotFound", "Entry not found", commit=repo.commit)
            meta = repo._meta[name]
            if meta["lfs"]:
                headers = {
                    "Location": f"{hub.cdn}/blobs/{meta['sha256']}?repo={repo_id}",
                    "X-Repo-Commit": repo.commit, "X-Linked-Etag": f'"{meta["sha256"]}"',
                    "X-Linked-Size": str(meta["size"]), "ETag": f'"{meta["blob"]}"',
                }
                return self._send(302, b"", headers, head=head)
            headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{meta["blob"]}"'}
            self._content(repo_id, name, repo, headers, head)

        def _blob(self, sha256: str, head: bool) -> None:
            owner = hub.blob_owner(sha256)
            if owner is None:
                return self._error(404, None, "no such blob")
            repo_id, name = owner
            self._content(repo_id, name, hub.repos[repo_id], {"ETag": f'"{sha256}"'}, head)

        def _content(self, repo_id: str, name: str, repo: FakeRepo, headers: dict, head: bool) -> None:
            content, size = repo.files[name], repo._meta[name]["size"]
            start, end, status = 0, size, 200
            rng = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            if rng:
                start = int(rng.group(1))
                end = int(rng.group(2)) + 1 if rng.group(2) else size
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
            headers.update({"Content-Length": str(end - start), "Accept-Ranges": "bytes",
                            "Content-Type": "application/octet-stream"})
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if head:
                return
            fault = hub.next_fault((repo_id, name), start, size)
            corrupt = (repo_id, name) in hub.corrupt
            pos = start  # the file's byte the next chunk starts at
            try:
                for chunk in _chunks(content, start, end, (64 << 10) if hub.rate else (1 << 20)):
                    if corrupt and pos <= size // 2 < pos + len(chunk):
                        i = size // 2 - pos
                        chunk = chunk[:i] + bytes([chunk[i] ^ 0xFF]) + chunk[i + 1:]
                    if fault and pos + len(chunk) > fault[1]:
                        self.wfile.write(chunk[:max(fault[1] - pos, 0)])
                        self.wfile.flush()
                        if fault[0] == "stall":
                            hub._closing.wait(hub.stall_seconds)
                        self.close_connection = True
                        return
                    self.wfile.write(chunk)
                    pos += len(chunk)
                    if hub.rate:
                        time.sleep(len(chunk) / hub.rate)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client is gone (killed, or timed out): nothing to tell it

        def _error(self, status: int, code: str | None, message: str, commit: str | None = None) -> None:
            headers = {"Content-Type": "application/json", "X-Error-Message": message}
            if code:
                headers["X-Error-Code"] = code
            if commit:
                headers["X-Repo-Commit"] = commit
            self._send(status, json.dumps({"error": message}).encode(), headers, head=self.command == "HEAD")

        def _send(self, status: int, body: bytes, headers: dict, head: bool) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

    return Handler
