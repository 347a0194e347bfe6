"""Talking to the Hugging Face Hub (or any server that speaks its API, e.g. a mirror).

Everything goes through huggingface_hub's HTTP session, URL builder, auth headers and error
parser, so ``HF_ENDPOINT``, ``HF_TOKEN``, ``hf auth login``'s token file, proxies and
``HF_HUB_OFFLINE`` behave as users expect. The endpoint is read at *call* time (the
``HF_ENDPOINT`` environment variable, else huggingface_hub's import-time constant), and every
request has a timeout. Errors come out as :class:`engine.errors.HubError` subclasses whose
messages tell the user what to do.

No Qt here; progress is reported with the frozen :class:`DownloadProgress`.
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from engine.errors import HubError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0
TOKEN_HELP = ("add a Hugging Face token: run `hf auth login` (or `huggingface-cli login`), set "
              "HF_TOKEN, or use “Hugging Face token…” in MTP Chat's model manager; also accept "
              "the model's licence on its Hugging Face page")


# ----------------------------------------------------------------------------- errors

class GatedRepoError(HubError):
    """The repo exists but needs a token (and an accepted licence)."""


class RepoNotFoundError(HubError):
    """No such repo (or a private one the token cannot see)."""


class RevisionNotFoundError(HubError):
    """The repo exists but the branch/tag/commit does not."""


class RemoteFileNotFoundError(HubError):
    """A file the repo listing promised is not there."""


class HubNetworkError(HubError):
    """No network, DNS failure, refused connection, timeout or a dropped connection."""


class HubServerError(HubError):
    """The server kept answering 5xx / 429."""


class IntegrityError(HubError):
    """A downloaded file does not match the size or sha256 the Hub advertised."""


class NotEnoughDiskError(HubError):
    """The disk-space preflight failed, or the disk filled up while writing."""


class UnusableModelError(HubError):
    """The repo's config or weights cannot be loaded by the engine; nothing was installed."""


class HubOfflineError(HubNetworkError):
    """HF_HUB_OFFLINE is set."""


# ----------------------------------------------------------------------------- value types

@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None = None  # LFS files only
    git_oid: str | None = None  # non-LFS files: the git blob sha1


@dataclass(frozen=True)
class RepoListing:
    repo_id: str
    revision: str
    commit: str
    files: tuple[RemoteFile, ...]

    def file(self, path: str) -> RemoteFile | None:
        return next((f for f in self.files if f.path == path), None)


Phase = Literal["planning", "downloading", "verifying", "converting", "installing", "done",
                "cancelled", "failed"]


@dataclass(frozen=True)
class DownloadProgress:
    """A snapshot of a download, sent to the progress callback (from the download's thread).

    ``bytes_done`` counts bytes on disk (including those found from an earlier run,
    ``resumed_bytes``); ``speed_bps`` is measured over the last few seconds; ``eta_s`` is None
    when unknown; ``stalled`` turns on after ``stalled_for_s`` seconds without a byte.
    """

    repo_id: str
    phase: Phase
    bytes_done: int = 0
    bytes_total: int = 0
    files_done: int = 0
    files_total: int = 0
    file: str | None = None
    file_bytes_done: int = 0
    file_bytes_total: int = 0
    speed_bps: float = 0.0
    eta_s: float | None = None
    stalled: bool = False
    stalled_for_s: float = 0.0
    resumed_bytes: int = 0
    retries: int = 0
    message: str = ""
    name: str = ""

    @property
    def fraction(self) -> float:
        return self.bytes_done / self.bytes_total if self.bytes_total else 0.0


@dataclass(frozen=True)
class DownloadResult:
    repo_id: str
    name: str
    status: Literal["installed", "cancelled"]
    path: str | None
    bytes_total: int
    bytes_fetched: int  # what this run actually downloaded
    resumed_bytes: int  # what was already there from an earlier run
    seconds: float
    converted: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)
    up_to_date: bool = False  # already installed from this revision: nothing was fetched


# ----------------------------------------------------------------------------- configuration

def endpoint() -> str:
    """``$HF_ENDPOINT`` now, else the endpoint huggingface_hub read at import."""
    env = os.environ.get("HF_ENDPOINT")
    if env:
        return env.rstrip("/")
    from huggingface_hub import constants

    return constants.ENDPOINT.rstrip("/")


def saved_token_path() -> Path:
    from engine.paths import data_dir

    return data_dir() / "hf_token"


def saved_token() -> str | None:
    """The token saved in MTP Chat's own settings (see :func:`save_token`)."""
    try:
        tok = saved_token_path().read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return tok or None


def save_token(token: str | None) -> None:
    """Save (or with None/"" forget) the user's token, readable only by the user."""
    path = saved_token_path()
    if not token:
        path.unlink(missing_ok=True)
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(token.strip())


def resolve_token(token: str | None = None) -> str | None:
    """Explicit token > HF_TOKEN > the app's saved token > huggingface_hub's (hf auth login)."""
    if token:
        return token
    if os.environ.get("HF_TOKEN"):
        return os.environ["HF_TOKEN"]
    mine = saved_token()
    if mine:
        return mine
    from huggingface_hub import get_token

    try:
        return get_token()
    except Exception as exc:  # noqa: BLE001 - a broken token file must not block public repos
        log.warning("could not read the huggingface_hub token: %s", exc)
        return None


def headers(token: str | None) -> dict[str, str]:
    from huggingface_hub.utils import build_hf_headers

    from engine import __version__

    h = build_hf_headers(token=token or False, library_name="mtpchat",
                         library_version=__version__)
    h["Accept-Encoding"] = "identity"  # byte ranges must address the stored bytes
    return h


def timeout(read_s: float = DEFAULT_TIMEOUT_S, connect_s: float = 10.0):
    import httpx2

    return httpx2.Timeout(read_s, connect=connect_s)


_URL_RE = re.compile(
    r"^(?:https?://)?(?:www\.)?(?:huggingface\.co|hf\.co)/(?P<repo>[^/\s]+/[^/\s?#]+)"
    r"(?:/(?:tree|blob|resolve)/(?P<rev>[^/\s?#]+))?")
_ID_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def parse_repo_ref(text: str) -> tuple[str, str | None]:
    """``"Qwen/Qwen3.5-4B"`` or a huggingface.co URL -> (repo_id, revision or None)."""
    s = text.strip().rstrip("/")
    m = _URL_RE.match(s)
    if m:
        repo, rev = m.group("repo"), m.group("rev")
    else:
        base = endpoint()
        if s.startswith(base + "/"):
            return parse_repo_ref("huggingface.co/" + s[len(base) + 1:])
        repo, rev = s, None
    if repo.endswith(".git"):
        repo = repo[:-4]
    if not _ID_RE.match(repo) or ".." in repo:
        raise RepoNotFoundError(f"{text!r} is not a Hugging Face model id (expected org/name or a "
                                "huggingface.co link)")
    return repo, rev


def file_url(repo_id: str, path: str, revision: str) -> str:
    from huggingface_hub import hf_hub_url

    return hf_hub_url(repo_id, path, revision=revision, endpoint=endpoint())


# ----------------------------------------------------------------------------- requests

def translate_error(exc: BaseException, *, repo_id: str, revision: str | None = None
                    ) -> HubError:
    """Turn huggingface_hub / httpx errors into HubError subclasses with useful messages."""
    import httpx2
    from huggingface_hub import errors as hf

    rev = f" at revision {revision!r}" if revision and revision != "main" else ""
    if isinstance(exc, HubError):
        return exc
    if isinstance(exc, hf.OfflineModeIsEnabled):
        return HubOfflineError("downloads are disabled because HF_HUB_OFFLINE is set; unset it "
                               "to download models")
    if isinstance(exc, hf.GatedRepoError):
        return GatedRepoError(f"{repo_id} is gated: you need access to download it — "
                              f"{TOKEN_HELP}")
    if isinstance(exc, hf.RepositoryNotFoundError):
        return RepoNotFoundError(f"{repo_id} was not found on {endpoint()} (check the spelling; "
                                 f"if it is private or gated, {TOKEN_HELP})")
    if isinstance(exc, hf.RevisionNotFoundError):
        return RevisionNotFoundError(f"{repo_id} has no revision {revision!r}")
    if isinstance(exc, hf.RemoteEntryNotFoundError):
        return RemoteFileNotFoundError(f"a file of {repo_id}{rev} is missing on the server: {exc}")
    if isinstance(exc, hf.HfHubHTTPError):
        code = exc.response.status_code if exc.response is not None else None
        if code in (401, 403):
            return GatedRepoError(f"access to {repo_id} was refused ({code}) — {TOKEN_HELP}")
        if code == 404:
            return RepoNotFoundError(f"{repo_id}{rev} was not found on {endpoint()}")
        if code is not None and (code >= 500 or code == 429):
            return HubServerError(f"the Hub answered {code} for {repo_id}; try again later")
        return HubError(f"the Hub refused a request for {repo_id}: {exc}")
    if isinstance(exc, httpx2.TimeoutException):
        return HubNetworkError(f"the connection to {endpoint()} timed out ({type(exc).__name__}); "
                               "check your network and retry — finished parts are kept")
    if isinstance(exc, (httpx2.TransportError, OSError)):
        return HubNetworkError(f"cannot reach {endpoint()}: {exc or type(exc).__name__} — check "
                               "your network and retry; finished parts are kept")
    return HubError(f"unexpected error talking to {endpoint()}: {exc!r}")


def request(method: str, url: str, *, token: str | None, repo_id: str,
            revision: str | None = None, extra_headers: dict | None = None,
            timeout_s: float = DEFAULT_TIMEOUT_S):
    """One non-streaming request; raises HubError subclasses on failure."""
    from huggingface_hub.utils import get_session, hf_raise_for_status

    try:
        resp = get_session().request(method, url, headers={**headers(token), **(extra_headers or {})},
                                     timeout=timeout(timeout_s), follow_redirects=True)
        hf_raise_for_status(resp)
        return resp
    except Exception as exc:  # noqa: BLE001 - translated below
        raise translate_error(exc, repo_id=repo_id, revision=revision) from exc


def get_json(url: str, **kw):
    resp = request("GET", url, **kw)
    try:
        return resp.json()
    except ValueError as exc:
        raise HubError(f"the server sent invalid JSON for {url}") from exc


def _quote_repo(repo_id: str) -> str:
    return "/".join(quote(p, safe="") for p in repo_id.split("/"))


def list_repo(repo_id: str, *, revision: str = "main", token: str | None = None,
              timeout_s: float = DEFAULT_TIMEOUT_S) -> RepoListing:
    """The repo's commit and every file with its size (and LFS sha256), in one consistent view.

    The commit is pinned first, so a later resume downloads exactly the same files.
    """
    token = resolve_token(token)
    base = f"{endpoint()}/api/models/{_quote_repo(repo_id)}"
    kw = dict(token=token, repo_id=repo_id, revision=revision, timeout_s=timeout_s)
    info = get_json(f"{base}/revision/{quote(revision, safe='')}", **kw)
    commit = info.get("sha")
    if not commit:
        raise HubError(f"{endpoint()} did not say which commit {repo_id}@{revision} is")
    url: str | None = f"{base}/tree/{commit}?recursive=true"
    files: list[RemoteFile] = []
    while url:
        resp = request("GET", url, **kw)
        for item in resp.json():
            if item.get("type") != "file":
                continue
            lfs = item.get("lfs") or {}
            files.append(RemoteFile(
                path=item["path"], size=int(lfs.get("size", item.get("size", 0))),
                sha256=lfs.get("oid") or lfs.get("sha256"),
                git_oid=None if lfs else item.get("oid")))
        url = resp.links.get("next", {}).get("url")
    if not files:  # some mirrors have no tree API: fall back to the siblings list
        files = [RemoteFile(s["rfilename"], int(s.get("size") or 0))
                 for s in info.get("siblings", [])]
    return RepoListing(repo_id, revision, commit, tuple(files))


def fetch_bytes(repo_id: str, path: str, *, revision: str, token: str | None = None,
                byte_range: tuple[int, int] | None = None,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> bytes:
    """A small file, or bytes [start, end] (inclusive) of a large one."""
    extra = {"Range": f"bytes={byte_range[0]}-{byte_range[1]}"} if byte_range else None
    resp = request("GET", file_url(repo_id, path, revision), token=resolve_token(token),
                   repo_id=repo_id, revision=revision, extra_headers=extra, timeout_s=timeout_s)
    data = resp.content
    if byte_range and resp.status_code == 200:  # server ignored Range: cut it ourselves
        data = data[byte_range[0]:byte_range[1] + 1]
    return data
