"""`infer pull`: fetch a model from the Hugging Face Hub into the HF cache and record it in the store.

Files go through `hf_hub_download`, so they land in the ordinary HF cache (`HF_HOME` / `HF_HUB_CACHE`)
and are shared with other HF tools. Every file is checked against the Hub's metadata (size, and the
LFS sha256 or git blob sha1) before the model is recorded; nothing reaches the store otherwise.
"""
from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from infer.quant.errors import InferError

from .gguf_file import SHARD_NAME
from .store import DEFAULT_QUANT, ModelStore, StoredModel, canonical_name, parse_name

# (file name, bytes done, total bytes or None): called as a file downloads, and once more when it is in place.
ProgressFn = Callable[[str, int, "int | None"], None]

# Files a safetensors / MLX model needs; the rest of such a repo (other weight formats, docs, images) is skipped.
_WEIGHTS_REPO_FILES = {
    "config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json", "tokenizer.model",
    "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "chat_template.json",
    "added_tokens.json",
}
_LICENSE = re.compile(r"(?i)^(license|licence|notice|use_policy)(\.(md|txt))?$")
# Quant tags as they appear in GGUF file names: Q4_K_M, q8_0, IQ4_XS, Q4_0_4_4, TQ1_0, F16, BF16, MXFP4_MOE...
_QUANT = re.compile(
    r"(?:^|[-._])(?P<tag>(?:I?Q\d+(?:_[A-Z0-9]+)*|TQ\d+_\d+|B?F16|F32|FP16|FP32|MXFP4(?:_MOE)?))(?=$|[-.])",
    re.IGNORECASE,
)
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_HASH_CHUNK = 8 << 20


class PullError(InferError, ValueError):
    """A pull that cannot be done as asked (unknown repo, no such quant, no access, offline and not cached...)."""


class ChecksumMismatchError(PullError):
    """A downloaded file does not match the Hub's size or hash; the bad copy has been deleted."""


@dataclass(frozen=True)
class RemoteFile:
    name: str  # repo-relative
    size: int | None
    sha256: str | None  # LFS files only
    blob_id: str | None  # git blob sha1 (of the LFS pointer, for LFS files)


@dataclass(frozen=True)
class Selection:
    kind: str  # "gguf" or "weights" (safetensors or MLX: told apart by config.json once it is here)
    quant: str | None
    files: tuple[RemoteFile, ...]  # for GGUF: the shards in order, the first one first


def quant_tag(filename: str) -> str | None:
    """'sub/Model-Q4_K_M-00001-of-00003.gguf' -> 'Q4_K_M'; None when the name carries no tag."""
    stem = Path(filename).name
    m = SHARD_NAME.match(stem)
    stem = m.group("base") if m else stem.removesuffix(".gguf").removesuffix(".GGUF")
    tags = list(_QUANT.finditer(stem))
    return tags[-1].group("tag").upper() if tags else None


def _gguf_groups(files: list[RemoteFile]) -> dict[str, list[RemoteFile]]:
    """GGUF files by quant tag (the file stem when there is none); a split model is one group, shards in order."""
    groups: dict[str, list[RemoteFile]] = {}
    for f in files:
        base = Path(f.name).name
        if not base.lower().endswith(".gguf") or base.lower().startswith("mmproj"):
            continue  # mmproj files are vision projectors, never a model by themselves
        m = SHARD_NAME.match(f.name)
        key = quant_tag(f.name) or (m.group("base") if m else f.name[: -len(".gguf")]).split("/")[-1].upper()
        groups.setdefault(key, []).append(f)
    for key, group in groups.items():
        group.sort(key=lambda f: f.name)
        splits = [SHARD_NAME.match(f.name) for f in group]
        if any(splits):
            bases = {(s.group("base"), s.group("n")) if s else None for s in splits}
            if len(bases) != 1 or None in bases:
                raise PullError(f"several GGUF files carry the tag {key}: {', '.join(f.name for f in group)}")
            n = int(splits[0].group("n"))
            if [int(s.group("i")) for s in splits] != list(range(1, n + 1)):
                raise PullError(f"split GGUF {key} is incomplete in the repo: {len(group)} of {n} shards")
        elif len(group) > 1:
            raise PullError(f"several GGUF files carry the tag {key}: {', '.join(f.name for f in group)}")
    return groups


def select_files(repo: str, quant: str | None, files: list[RemoteFile]) -> Selection:
    """Which files of the repo make up the model asked for (quant tags compare case-insensitively)."""
    groups = _gguf_groups(files)
    if groups:
        tags = sorted(groups)
        if quant is None:
            if DEFAULT_QUANT in groups:
                quant = DEFAULT_QUANT
            elif len(groups) == 1:
                quant = tags[0]
            else:
                raise PullError(f"{repo} has several quants ({', '.join(tags)}) and no {DEFAULT_QUANT}: "
                                f"pick one, e.g. infer pull {repo}:{tags[0]}")
        quant = quant.upper()
        if quant not in groups:
            raise PullError(f"{repo} has no {quant} file; available quants: {', '.join(tags)}")
        return Selection("gguf", quant, tuple(groups[quant]))
    if quant is not None:
        raise PullError(f"{repo} has no GGUF files, so no quant {quant} to pick (pull it as {repo})")
    names = {f.name for f in files}
    if "config.json" not in names or not any(n.endswith(".safetensors") and "/" not in n for n in names):
        raise PullError(f"{repo} has neither GGUF files nor config.json with *.safetensors weights: nothing infer can use")
    # vocab.json / merges.txt only matter when there is no tokenizer.json to build the tokenizer from.
    wanted = set(_WEIGHTS_REPO_FILES) | ({"vocab.json", "merges.txt"} if "tokenizer.json" not in names else set())
    chosen = [f for f in files if "/" not in f.name and (
        f.name in wanted or f.name.endswith(".safetensors") or f.name.endswith(".safetensors.index.json")
        or _LICENSE.match(f.name))]
    # config.json first: the format (MLX or plain safetensors) is read from it.
    chosen.sort(key=lambda f: (f.name != "config.json", f.name))
    return Selection("weights", None, tuple(chosen))


def weights_format(config_path: str | Path) -> str:
    """'mlx' for an MLX checkpoint (its config.json has a "quantization" section), else 'safetensors'."""
    try:
        config = json.loads(Path(config_path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise PullError(f"{config_path}: unreadable config.json ({e})") from None
    return "mlx" if isinstance(config, dict) and isinstance(config.get("quantization"), dict) else "safetensors"


def pull(name: str, *, revision: str | None = None, token: str | None = None, offline: bool = False,
         progress: ProgressFn | None = None, store: ModelStore | None = None) -> StoredModel:
    """Fetch `owner/repo[:QUANT]` at `revision` (default: main), verify it, record it in the store."""
    from huggingface_hub import constants

    try:
        repo, quant = parse_name(name)
    except ValueError as e:
        raise PullError(str(e)) from None
    store = store if store is not None else ModelStore()
    if offline or constants.is_offline_mode():
        return _pull_offline(repo, quant, revision, store)
    return _pull_online(repo, quant, revision, token, progress or _no_progress, store)


def _no_progress(name: str, done: int, total: int | None) -> None:
    pass


def _pull_online(repo: str, quant: str | None, revision: str | None, token: str | None,
                 progress: ProgressFn, store: ModelStore) -> StoredModel:
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    with _hub_errors(repo, revision, api.endpoint, token):
        info = api.model_info(repo, revision=revision, files_metadata=True)
        commit = info.sha
        if not commit:
            raise PullError(f"{api.endpoint} sent no commit for {repo}: is HF_ENDPOINT a Hugging Face Hub?")
        remote = [RemoteFile(s.rfilename, s.size, s.lfs.sha256 if s.lfs else None, s.blob_id)
                  for s in info.siblings or ()]
        sel = select_files(repo, quant, remote)
        paths: list[str] = []
        for f in sel.files:
            path = _fetch(repo, f, commit, token, progress)
            progress(f.name, os.path.getsize(path), os.path.getsize(path))
            paths.append(path)
    snapshot = _snapshot_dir(paths[0], sel.files[0].name)
    _remember_ref(snapshot, revision or "main", commit)
    fmt = "gguf" if sel.kind == "gguf" else weights_format(paths[0])
    model = StoredModel(
        name=canonical_name(repo, sel.quant), repo=repo, quant=sel.quant, revision=commit, format=fmt,
        path=paths[0] if fmt == "gguf" else str(snapshot), files=tuple(f.name for f in sel.files),
        size=sum(os.path.getsize(p) for p in paths), pulled_at=_now(),
    )
    store.add(model)
    return model


def _fetch(repo: str, f: RemoteFile, commit: str, token: str | None, progress: ProgressFn) -> str:
    """hf_hub_download and _verify. A bad copy that was already in the cache is deleted and fetched again,
    once: huggingface_hub puts a download in place before it can be hashed, so a pull killed in between
    leaves the Hub's bad bytes there (or the disk damaged them); only a bad download of this pull fails."""
    from huggingface_hub import hf_hub_download

    downloaded = False

    def seen(name: str, done: int, total: int | None) -> None:
        nonlocal downloaded
        downloaded = True  # huggingface_hub only opens a progress bar for a transfer
        progress(name, done, total)

    for attempt in (1, 2):
        # Pinned to the commit model_info saw, so every file comes from the same revision.
        path = os.path.abspath(hf_hub_download(repo, f.name, revision=commit, token=token,
                                               tqdm_class=functools.partial(_ProgressRelay, seen, f.name)))
        try:
            _verify(path, f)
            break
        except ChecksumMismatchError:
            if downloaded or attempt == 2:
                raise
    return path


def _pull_offline(repo: str, quant: str | None, revision: str | None, store: ModelStore) -> StoredModel:
    """Offline: the store's entry if its files are still cached, else whatever the HF cache holds."""
    from huggingface_hub import hf_hub_download

    known = store.get(canonical_name(repo, quant))
    if known is not None and revision in (None, known.revision):
        try:
            for f in known.files:
                hf_hub_download(repo, f, revision=known.revision, local_files_only=True)
            return known
        except OSError:
            pass  # files gone from the HF cache: look for another cached revision below
    snapshot = _cached_snapshot(repo, revision or "main")
    if snapshot is None:
        what = f"{repo}" + (f" at {revision}" if revision else "")
        raise PullError(f"{what} is not in the local cache and offline mode is on "
                        f"(--offline or HF_HUB_OFFLINE=1): pull it once while online")
    local = [RemoteFile(p.relative_to(snapshot).as_posix(), p.stat().st_size, None, None)
             for p in sorted(snapshot.rglob("*")) if p.is_file()]
    try:
        sel = select_files(repo, quant, local)
    except PullError as e:
        raise PullError(f"offline, from the local cache: {e}") from None
    paths = [str(snapshot / f.name) for f in sel.files]
    fmt = "gguf" if sel.kind == "gguf" else weights_format(paths[0])
    model = StoredModel(
        name=canonical_name(repo, sel.quant), repo=repo, quant=sel.quant, revision=snapshot.name, format=fmt,
        path=paths[0] if fmt == "gguf" else str(snapshot), files=tuple(f.name for f in sel.files),
        size=sum(f.size or 0 for f in sel.files), pulled_at=_now(),
    )
    store.add(model)
    return model


def _cached_snapshot(repo: str, revision: str) -> Path | None:
    """The HF cache snapshot folder for repo at revision (a commit, or a branch/tag recorded under refs/)."""
    from huggingface_hub import constants

    repo_dir = Path(constants.HF_HUB_CACHE) / ("models--" + repo.replace("/", "--"))
    commit = revision if _COMMIT.match(revision) else None
    if commit is None:
        try:
            commit = (repo_dir / "refs" / revision).read_text().strip()
        except OSError:
            return None
    snapshot = repo_dir / "snapshots" / commit
    return snapshot.resolve() if snapshot.is_dir() else None


class _ProgressRelay:
    """Stands in for tqdm inside hf_hub_download: passes the byte count on to a ProgressFn."""

    def __init__(self, report: ProgressFn, name: str, *, total: int | None = None, initial: int = 0, **_: object):
        self.report, self.name, self.total, self.n = report, name, total, initial
        report(name, initial, total)

    def update(self, n: int = 1) -> None:
        self.n += n  # negative when the server ignored a Range request and the file starts over
        self.report(self.name, self.n, self.total)

    def close(self) -> None:
        pass

    def __enter__(self) -> "_ProgressRelay":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _verify(path: str, f: RemoteFile) -> None:
    """Check a cached file against the Hub's size and hash; delete it (blob and link) when it differs."""
    if f.size is None:
        raise PullError(f"the Hub sent no size for {f.name}, so it cannot be verified: is HF_ENDPOINT a Hugging Face Hub?")
    size = os.path.getsize(path)
    problem = None
    if size != f.size:
        problem = f"{size} bytes, expected {f.size}"
    elif f.sha256 is not None:
        got = _file_hash(path, hashlib.sha256())
        if got != f.sha256.lower():
            problem = f"sha256 {got}, expected {f.sha256}"
    elif f.blob_id is not None and len(f.blob_id) == 40:
        # Small (non-LFS) files are identified by their git blob sha1: sha1(b"blob <size>\0" + content).
        h = hashlib.sha1(f"blob {size}\0".encode())
        got = _file_hash(path, h)
        if got != f.blob_id.lower():
            problem = f"git blob sha1 {got}, expected {f.blob_id}"
    if problem is None:
        return
    blob = os.path.realpath(path)
    for p in {blob, path}:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
    raise ChecksumMismatchError(f"checksum mismatch for {f.name}: {problem} (the bad download was deleted; pull again)")


def _file_hash(path: str, h: "hashlib._Hash") -> str:
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _snapshot_dir(path: str, rel: str) -> Path:
    """'<cache>/models--o--r/snapshots/<sha>/sub/f.gguf' with rel 'sub/f.gguf' -> '<cache>/models--o--r/snapshots/<sha>'."""
    return Path(path).parents[len(Path(rel).parts) - 1]


def _remember_ref(snapshot: Path, revision: str, commit: str) -> None:
    """Record branch -> commit under refs/, as snapshot_download does, so HF tools find the files offline by branch."""
    if _COMMIT.match(revision) or snapshot.parent.name != "snapshots":
        return
    ref = snapshot.parent.parent / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(f"{ref.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(commit)
        os.replace(tmp, ref)
    finally:
        tmp.unlink(missing_ok=True)


def _now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def _chain(e: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _network_error(e: BaseException, repo: str, endpoint: str) -> PullError | None:
    """The one-line error for a network failure, None when e is not one. A server that cannot be reached
    and a download that broke off (stalled past the read timeout, or dropped) after huggingface_hub's
    retries are told apart: the second is no reason to check HF_ENDPOINT or go --offline."""
    from huggingface_hub import constants

    # By name, not class: the HTTP client under huggingface_hub (requests, httpx, httpx2) depends on its version.
    # The outermost exception of the chain that names a cause wins: it is how the last try ended.
    for x in _chain(e):
        names = {c.__name__ for c in type(x).__mro__}
        if "OfflineModeIsEnabled" in names:
            return None
        if names & {"ReadTimeout", "ReadTimeoutError"}:
            return PullError(f"downloading {repo} stalled: no data for {constants.HF_HUB_DOWNLOAD_TIMEOUT} s "
                             f"(HF_HUB_DOWNLOAD_TIMEOUT), also when retried; pull again (an unfinished file "
                             f"starts over)")
        if names & {"RemoteProtocolError", "ReadError", "ChunkedEncodingError", "ProtocolError"}:
            return PullError(f"the connection kept dropping while downloading {repo}, also when retried; "
                             f"pull again (an unfinished file starts over)")
        if names & {"ConnectError", "ConnectTimeout", "ConnectionError", "TimeoutException", "NetworkError"}:
            return PullError(f"cannot reach the Hub at {endpoint} (connection failed): check the network or "
                             f"HF_ENDPOINT, or use --offline for cached models")
    return None


@contextmanager
def _hub_errors(repo: str, revision: str | None, endpoint: str, token: str | None) -> Iterator[None]:
    """Turn huggingface_hub's and the network's failures into one-line PullErrors."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        yield
    except PullError:
        raise
    except GatedRepoError:
        how = "the token has no access: accept the model's terms on the Hub" if token or _env_token() else \
            "set HF_TOKEN (or pass --token) after accepting the model's terms on the Hub"
        raise PullError(f"{repo} is gated: {how}") from None
    except RepositoryNotFoundError as e:
        status = e.response.status_code if e.response is not None else None
        if status == 401 and not (token or _env_token()):
            raise PullError(f"repository {repo} not found on {endpoint}, or it is private: set HF_TOKEN "
                            f"(or pass --token) if you have access") from None
        raise PullError(f"repository {repo} not found on {endpoint}") from None
    except RevisionNotFoundError:
        raise PullError(f"revision {revision!r} not found in {repo}") from None
    except RemoteEntryNotFoundError as e:
        raise PullError(f"file not found in {repo}: {e.response.url if e.response is not None else e}") from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        if status in (401, 403):
            raise PullError(f"access to {repo} denied (HTTP {status}): check HF_TOKEN / --token") from None
        raise PullError(f"{endpoint} answered HTTP {status} for {repo}") from None
    except OSError as e:
        if e.errno == errno.ENOSPC or any(getattr(x, "errno", None) == errno.ENOSPC for x in _chain(e)):
            from huggingface_hub import constants
            raise PullError(f"disk full while downloading {repo} into {constants.HF_HUB_CACHE}") from None
        if (net := _network_error(e, repo, endpoint)) is not None:
            raise net from None
        if "Consistency check failed" in str(e):
            raise ChecksumMismatchError(f"checksum mismatch: {str(e).splitlines()[0]}") from None
        raise
    except Exception as e:
        if (net := _network_error(e, repo, endpoint)) is not None:
            raise net from None
        raise


def _env_token() -> str | None:
    from huggingface_hub import get_token

    return get_token()
