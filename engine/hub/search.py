"""Searching the Hugging Face Hub for models this engine runs.

Through huggingface_hub's own API (``HfApi.list_models``: no scraping), so ``HF_ENDPOINT``,
tokens, proxies and ``HF_HUB_OFFLINE`` behave as everywhere else. One :class:`HubSearch` is one
query: :meth:`HubSearch.next_page` returns the next ``page_size`` results of the families this
engine runs (Qwen3.5 / Qwen3.6, dense and MoE, judged from each repo's ``config``), walking the
Hub's own pages (its ``Link: rel="next"`` header) lazily. Each :class:`SearchResult` carries what
the listing says (downloads, likes, gated, licence, size on the Hub); :func:`check` then reads
the repo's safetensors *headers* only (``engine.hub.inspection.inspect_repo``: a few KB per shard)
to say whether it carries MTP tensors, how it is quantized, how much memory it needs and this
machine's verdict. A gated repo without access is reported as such, not as an error.

Failures are :class:`engine.errors.HubError` subclasses with one actionable line; offline, the
message says the models on this machine are still listed.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from engine.errors import HubError
from engine.models.checkpoint import ARCH_FAMILY, TYPE_FAMILY

log = logging.getLogger(__name__)

EXPAND = ["config", "downloads", "likes", "gated", "cardData", "tags", "usedStorage",
          "lastModified", "sha"]
MAX_SCAN_PER_PAGE = 400  # Hub entries looked at to fill one page of matches
OFFLINE_HINT = ("search needs the Hugging Face Hub; the models already on this machine are "
                "still listed (`python -m engine list`, or “On this machine” in the app)")


@dataclass(frozen=True)
class SearchResult:
    repo_id: str
    family: str | None
    downloads: int = 0
    likes: int = 0
    gated: str | bool = False
    license: str | None = None
    size_bytes: int | None = None
    last_modified: str | None = None
    quantization: dict | None = None
    # Filled by check(): None = not checked yet (or could not be: see ``note``).
    has_mtp: bool | None = None
    supported: bool | None = None
    memory_needed_bytes: int | None = None
    download_bytes: int | None = None
    verdict: str | None = None
    note: str | None = None
    mtp_offer: dict | None = None  # headless: where its MTP head can be grafted from

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


def family_of(config: dict | None, tags: list[str] | None = None) -> str | None:
    """The engine family a listing's config (or, lacking one, its tags) names, else None."""
    config = config if isinstance(config, dict) else {}
    for arch in config.get("architectures") or []:
        if arch in ARCH_FAMILY:
            return ARCH_FAMILY[arch]
    mtype = config.get("model_type")
    if isinstance(mtype, str) and mtype in TYPE_FAMILY:
        return TYPE_FAMILY[mtype]
    if not config:
        return next((TYPE_FAMILY[t] for t in tags or [] if t in TYPE_FAMILY), None)
    return None


def _result(info) -> SearchResult | None:
    family = family_of(info.config, info.tags)
    if family is None:
        return None
    card = info.card_data
    lic = getattr(card, "license", None) if card is not None else None
    quant = (info.config or {}).get("quantization")
    return SearchResult(
        repo_id=info.id, family=family, downloads=int(info.downloads or 0),
        likes=int(info.likes or 0), gated=info.gated or False,
        license=lic if isinstance(lic, str) else None,
        size_bytes=getattr(info, "used_storage", None),
        last_modified=str(info.last_modified) if info.last_modified else None,
        quantization=quant if isinstance(quant, dict) else None)


class HubSearch:
    """One query's results, a page at a time (``next_page``); ``more`` is False at the end."""

    def __init__(self, query: str, *, page_size: int = 20, token: str | None = None) -> None:
        query = (query or "").strip()
        if not query:
            raise HubError("type something to search for (e.g. “Qwen3.5 MTP”)")
        if not 1 <= page_size <= 100:
            raise HubError(f"the page size must be between 1 and 100, not {page_size}")
        self.query, self.page_size, self.token = query, page_size, token
        self.more = True
        self._items: Iterator | None = None

    def _iterator(self) -> Iterator:
        from urllib.parse import urlencode

        from huggingface_hub import HfApi

        from engine.hub import client as hub

        # One quick request first: huggingface_hub retries a refused connection with backoff
        # for tens of seconds; offline should be said at once.
        probe = urlencode({"search": self.query, "limit": 1})
        hub.request("GET", f"{hub.endpoint()}/api/models?{probe}",
                    token=hub.resolve_token(self.token), repo_id=f"search {self.query!r}",
                    timeout_s=10.0)
        api = HfApi(endpoint=hub.endpoint(), token=hub.resolve_token(self.token) or False,
                    library_name="mtpchat")
        return iter(api.list_models(search=self.query, expand=EXPAND))

    def next_page(self) -> list[SearchResult]:
        """The next page of matching results (fewer, or none, at the end)."""
        from engine.hub import client as hub

        out: list[SearchResult] = []
        try:
            if self._items is None:
                self._items = self._iterator()
            for _ in range(MAX_SCAN_PER_PAGE):
                info = next(self._items, None)
                if info is None:
                    self.more = False
                    break
                r = _result(info)
                if r is not None:
                    out.append(r)
                if len(out) == self.page_size:
                    break
        except Exception as exc:  # noqa: BLE001 - translated to one actionable line
            err = hub.translate_error(exc, repo_id=f"search {self.query!r}")
            if isinstance(err, hub.HubNetworkError):
                raise type(err)(f"{err} — {OFFLINE_HINT}") from exc
            raise err from exc
        return out


def check(result: SearchResult, *, token: str | None = None,
          total_memory: int | None = None) -> SearchResult:
    """``result`` with MTP / quantization / memory / verdict from the repo's headers."""
    from engine.hub import client as hub
    from engine.hub.inspection import inspect_repo, machine_verdict

    try:
        r = inspect_repo(result.repo_id, token=token)
    except hub.GatedRepoError:
        return replace(result, note="gated: accept the licence on its Hub page and add a token "
                                    "to check it")
    except HubError as exc:
        return replace(result, note=str(exc))
    except Exception as exc:  # noqa: BLE001 - a malformed repo must not break the page
        return replace(result, note=f"cannot be checked: {exc}")
    verdict = r["machine"]["verdict"] if total_memory is None else \
        machine_verdict(r["memory_needed_bytes"], total_memory=total_memory)["verdict"]
    return replace(result, has_mtp=r["has_mtp"], supported=r["supported"],
                   quantization=r["quantization"], memory_needed_bytes=r["memory_needed_bytes"],
                   download_bytes=r.get("download_bytes"), verdict=verdict,
                   mtp_offer=r.get("mtp_head"),
                   note=(r["mtp_head"]["line"] if r.get("mtp_head") else None)
                   if r["supported"] else "; ".join(r["reasons"]))


def check_all(results: list[SearchResult], *, token: str | None = None,
              total_memory: int | None = None, workers: int = 4) -> list[SearchResult]:
    """:func:`check` for a page, a few repos at a time (order kept)."""
    if not results:
        return []
    with ThreadPoolExecutor(max_workers=min(workers, len(results))) as pool:
        return list(pool.map(lambda r: check(r, token=token, total_memory=total_memory),
                             results))
