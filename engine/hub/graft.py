"""``graft``: give a headless MLX conversion its MTP head, downloading only the head (Qwen3.5/3.6
and Qwen3-Next: ``mtp.*``; GLM-4.x, GLM-4.7-Flash, DeepSeek-V3: the nextn layer
``model.layers.{num_hidden_layers}.*``, ``graft_source.head_test``).

Steps (each refusal is one line and leaves the model exactly as it was):

1. the model: a folder, an installed name, or a model another app keeps (Hugging Face cache,
   LM Studio...), supported and without ``mtp.*``;
2. the source (``graft_source.candidates``): ``--from``, the card's ``base_model``, the
   conversion's metadata, or the official Qwen repo its name or shape matches; its config and
   the headers of the shards that matter are read with Range requests;
3. the trunk is proved to be the source's (``graft_verify``): config and shapes, then small
   unquantized tensors compared bit for bit — before any head byte;
4. the ``mtp.*`` spans are fetched with Range requests (``graft_fetch``), resumable, sizes and
   (where the Hub gives one) sha256 checked;
5. the head is written at 8 bits or more (``graft_head``) and the model is assembled in a
   staging view: hard links to the model's files, a new config.json and the sidecar;
6. acceptance is measured there on a built-in calibration; near zero -> refused;
7. installed: beside a model the store owns (the sidecar, then config.json atomically, then
   the install record), or — for a model another app owns — as a new store model whose files
   are hard links to the original's (a copy when the store is on another disk). Another app's
   folder is never written to.
"""
from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from engine.errors import HubError, ModelLoadError
from engine.hub import client as hub
from engine.hub.client import DownloadProgress
from engine.hub.graft_fetch import FetchCancelled, SpanFetcher, assemble, plan_spans
from engine.hub.graft_drafter import sibling_drafter
from engine.hub.graft_head import (HEAD_BITS, SIDECAR, grafted_config, measure_acceptance,
                                   trunk_float_dtype, write_nextn_sidecar, write_sidecar)
from engine.hub.graft_source import GraftError, Source, candidates, read_source, remember_offer
from engine.hub.graft_verify import COMPARED, check_config, check_tensors
from engine.hub.store import MARKER_DIR, Store, model_name, write_json_atomic
from engine.models.families import NEXTN

log = logging.getLogger(__name__)

MIN_ACCEPTANCE = 0.10
WORK_DIR = ".graft"
ProgressFn = Callable[[DownloadProgress], None]


@dataclass(frozen=True)
class GraftResult:
    status: str                 # "grafted" | "cancelled"
    name: str
    path: str | None
    mode: str                   # "sidecar" (beside a store model) | "linked" (new store model)
    source: str
    commit: str
    bits: int
    head_bytes: int             # the head's tensors in the source
    bytes_fetched: int          # head bytes this run downloaded
    resumed_bytes: int          # head bytes found from an earlier run
    metadata_bytes: int         # config, index and headers read
    check_bytes: int            # trunk tensors read to prove the match
    repo_bytes: int             # what downloading the whole source would cost
    sidecar_bytes: int = 0
    acceptance: float | None = None
    drafted: int = 0
    seconds: float = 0.0

    @property
    def bytes_downloaded(self) -> int:
        return self.bytes_fetched + self.metadata_bytes + self.check_bytes


@dataclass(frozen=True)
class Target:
    folder: Path                # the model as it is
    name: str                   # the store name the grafted model has
    mode: str
    found_as: str | None        # the repo id another app keeps it under


def _target(model: str | Path, store: Store) -> Target:
    from engine.hub.store import resolve_model
    from engine.paths import default_model_path

    folder = resolve_model(model, root=store.root)
    real = folder.resolve()
    if real == default_model_path().resolve():
        raise GraftError("the built-in demo model already has its MTP head")
    root = store.root.resolve()
    if root in real.parents and real.parent == root:
        return Target(folder, folder.name, "sidecar", (store.installed_marker(folder) or {})
                      .get("repo_id"))
    from engine.hub.scan import scan

    found = next((f for f in scan() if f.path.resolve() == real), None)
    name = found.name if found else folder.name
    return Target(folder, model_name(name, suffix="mtp"), "linked",
                  name if found and "/" in name else None)


def _check_model(folder: Path):
    from engine.models.checkpoint import read_checkpoint

    ckpt = read_checkpoint(folder)
    if ckpt.has_mtp:
        raise GraftError(f"{folder.name} already has an MTP head; nothing to graft")
    return ckpt


def find_source(target: Target, *, explicit: str | None, revision: str, token: str | None,
                config: dict) -> Source:
    """The first candidate that exists, has a head and whose config matches."""
    cands = candidates(target.folder, explicit=explicit, repo_id=target.found_as, token=token)
    if not cands:
        raise GraftError(f"no source found for {target.folder.name}'s MTP head: pass the repo "
                         "it was converted from with --from ORG/NAME")
    first: Exception | None = None
    for repo, why in cands:
        try:
            src = read_source(repo, revision=revision, token=token, want=COMPARED)
            check_config(config, src)
            log.info("source %s (%s)", repo, why)
            return src
        except (hub.RepoNotFoundError, GraftError) as exc:
            if explicit:
                raise
            first = first or exc
    raise first  # type: ignore[misc]


class Grafter:
    """One graft; :meth:`run` blocks. ``cancel`` may be set from any thread."""

    def __init__(self, model: str | Path, *, source: str | None = None, revision: str = "main",
                 bits: int = 8, token: str | None = None, store: Store | None = None,
                 progress: ProgressFn | None = None, cancel: threading.Event | None = None,
                 min_acceptance: float = MIN_ACCEPTANCE) -> None:
        if bits not in HEAD_BITS:
            raise GraftError(f"--bits must be 8 or 16 (the head is never below 8 bits), not "
                             f"{bits!r}")
        self.model, self.explicit, self.revision = model, source, revision
        self.bits, self.token = bits, hub.resolve_token(token)
        self.store = store or Store()
        self.progress_fn = progress or (lambda p: None)
        self.cancel = cancel or threading.Event()
        self.min_acceptance = min_acceptance
        self._state = DownloadProgress(repo_id=source or "", phase="planning")

    def _emit(self, **changes) -> None:
        self._state = replace(self._state, **changes)
        self.progress_fn(self._state)

    def run(self) -> GraftResult:
        t0 = time.monotonic()
        try:
            return self._run(t0)
        except (FetchCancelled, KeyboardInterrupt):
            self._emit(phase="cancelled", message="cancelled; what was fetched is kept")
            return GraftResult("cancelled", self._state.name, None, "", self._state.repo_id,
                               "", self.bits, 0, 0, 0, 0, 0, 0, seconds=time.monotonic() - t0)
        except Exception as exc:
            self._emit(phase="failed", message=str(exc))
            raise

    def _run(self, t0: float) -> GraftResult:
        target = _target(self.model, self.store)
        self._emit(name=target.name, message="checking the model")
        ckpt = _check_model(target.folder)
        drafter = self._local_drafter(target)
        if drafter is not None:
            return self._with_lock(target, lambda: self._from_drafter(target, ckpt, drafter, t0))
        self._emit(message="finding the head's source")
        src = find_source(target, explicit=self.explicit, revision=self.revision,
                          token=self.token, config=ckpt.config.raw)
        self._emit(repo_id=src.repo_id, message=f"checking the trunk against {src.repo_id}")
        check_bytes = check_tensors(target.folder, src, self.token)
        remember_offer(src)
        return self._with_lock(target, lambda: self._from_hub(target, ckpt, src, check_bytes,
                                                              t0))

    def _local_drafter(self, target: Target) -> Path | None:
        """``--from FOLDER`` (an mlx-vlm drafter), or the ``<model>-mtp`` drafter mlx-vlm's
        ``convert --mtp`` left beside the model."""
        if self.explicit and Path(self.explicit).expanduser().is_dir():
            return Path(self.explicit).expanduser()
        return None if self.explicit else sibling_drafter(target.folder)

    def _with_lock(self, target: Target, fn):
        lock = self.store.try_lock(target.name)
        if lock is None:
            raise GraftError(f"{target.name} is being downloaded, converted or deleted right "
                             "now; try again when that has finished")
        try:
            return fn()
        finally:
            lock.close()

    def _from_hub(self, target: Target, ckpt, src: Source, check_bytes: int,
                  t0: float) -> GraftResult:
        work = self.store.root / WORK_DIR / target.name
        spans = plan_spans(src)
        fetcher = SpanFetcher(src, spans, work / "spans", token=self.token, cancel=self.cancel,
                              progress=self._on_bytes)
        self._emit(phase="downloading", bytes_total=fetcher.total, files_total=len(spans),
                   message=f"MTP head from {src.repo_id}")
        paths = fetcher.run()
        self._emit(phase="converting", message=f"writing the head at {self._bits(ckpt)} bits")
        view = self._view(target, ckpt, src, work, paths, spans)
        result = GraftResult(
            "grafted", target.name, None, target.mode, src.repo_id, src.commit,
            self._bits(ckpt), src.head_bytes, fetcher.fetched, fetcher.resumed,
            src.metadata_bytes, check_bytes, src.repo_bytes,
            sidecar_bytes=(view / SIDECAR).stat().st_size)
        return self._calibrate_and_install(target, view, work, result, t0)

    def _from_drafter(self, target: Target, ckpt, drafter: Path, t0: float) -> GraftResult:
        from engine.hub.graft_drafter import (check_drafter, write_from_drafter,
                                              write_from_nextn_drafter)

        self._emit(repo_id=str(drafter), message=f"checking the drafter {drafter.name}")
        raw = check_drafter(drafter, ckpt.config.raw)
        work = self.store.root / WORK_DIR / target.name
        view = self._fresh_view(target, work)
        quant = ckpt.config.quantization or {}
        group = int(quant.get("group_size", 64))
        self._emit(phase="converting", message=f"writing the head from {drafter.name}")
        text = raw.get("text_config") or {}
        if ckpt.config.family in NEXTN:
            norms, layers = None, 0
            packing = write_from_nextn_drafter(
                drafter, view / SIDECAR, layer=int(ckpt.config.text["num_hidden_layers"]),
                quant=raw.get("quantization"))
        else:
            norms, packing = write_from_drafter(
                drafter, view / SIDECAR, bits=self._bits(ckpt), group_size=group,
                dtype=trunk_float_dtype(ckpt.tensors), quant=raw.get("quantization"))
            layers = int(text.get("mtp_num_hidden_layers") or 1)
        write_json_atomic(view / "config.json", grafted_config(
            ckpt.config.raw, source=str(drafter), commit=None, norms=norms, packing=packing,
            mtp_layers=layers))
        head = sum(p.stat().st_size for p in drafter.glob("*.safetensors"))
        result = GraftResult("grafted", target.name, None, target.mode, str(drafter), "",
                             int(packing["bits"]) if packing else 16, head, 0, 0, 0, 0, 0,
                             sidecar_bytes=(view / SIDECAR).stat().st_size)
        return self._calibrate_and_install(target, view, work, result, t0)

    def _calibrate_and_install(self, target: Target, view: Path, work: Path,
                               result: GraftResult, t0: float) -> GraftResult:
        self._emit(phase="verifying", message="measuring acceptance on the calibration")
        try:
            acceptance, drafted = measure_acceptance(view, cancel=self.cancel)
        except ModelLoadError as exc:
            shutil.rmtree(view, ignore_errors=True)
            raise GraftError(f"refused: the grafted model does not load ({exc}); the model was "
                             "left as it was") from exc
        if self.cancel.is_set():
            shutil.rmtree(view, ignore_errors=True)
            raise FetchCancelled("cancelled")
        if acceptance < self.min_acceptance:
            shutil.rmtree(view, ignore_errors=True)
            raise GraftError(
                f"refused: the MTP head from {result.source} does not fit this model "
                f"(acceptance {acceptance:.2f} at depth 3 on the built-in calibration, under "
                f"{self.min_acceptance:.2f}); the model was left as it was")
        self._emit(phase="installing", message="installing")
        result = replace(result, acceptance=round(acceptance, 4), drafted=drafted)
        path = self._install(target, view, result)
        shutil.rmtree(work, ignore_errors=True)
        result = replace(result, path=str(path), seconds=round(time.monotonic() - t0, 2))
        self._emit(phase="done", message=f"acceptance {acceptance:.2f}")
        return result

    def _on_bytes(self, done: int, total: int, resumed: int, message: str) -> None:
        self._emit(bytes_done=done, bytes_total=total, resumed_bytes=resumed)

    def _bits(self, ckpt) -> int:
        """The head keeps its precision on an unquantized trunk; never below 8 bits."""
        return self.bits if ckpt.config.quantization else 16

    def _view(self, target: Target, ckpt, src: Source, work: Path, paths, spans) -> Path:
        """The grafted model assembled in staging: links to the model's files, the sidecar,
        a new config.json. For a linked graft this is the store model to be installed."""
        view = self._fresh_view(target, work)
        raw = assemble(src, spans, paths, work / "head-raw.safetensors")
        quant = ckpt.config.quantization or {}
        group = int(quant.get("group_size", 64))
        nextn = ckpt.config.family in NEXTN
        (write_nextn_sidecar if nextn else write_sidecar)(
            raw, view / SIDECAR, bits=self._bits(ckpt), group_size=group,
            dtype=trunk_float_dtype(ckpt.tensors))
        bits = self._bits(ckpt)
        if nextn and not any(k.endswith(".scales") for k in _tensor_names(view / SIDECAR)):
            bits = 16  # stored as the source has it (fp8 with weight_scale_inv)
        config = grafted_config(ckpt.config.raw, source=src.repo_id, commit=src.commit,
                                mtp_layers=0 if nextn else
                                int(src.text.get("mtp_num_hidden_layers") or 1),
                                norms=None if nextn else "raw_hf_delta",
                                packing={"bits": bits, "group_size": group} if bits < 16
                                else None)
        write_json_atomic(view / "config.json", config)
        return view

    def _fresh_view(self, target: Target, work: Path) -> Path:
        """An empty staging view holding links to the model's files (but config.json)."""
        view = self.store.staging_path(target.name) if target.mode == "linked" \
            else work / "view"
        shutil.rmtree(view, ignore_errors=True)
        view.mkdir(parents=True)
        link_files(target.folder, view)
        return view

    def _install(self, target: Target, view: Path, result: GraftResult) -> Path:
        record = {"source": result.source, "commit": result.commit, "bits": result.bits,
                  "acceptance": result.acceptance, "head_bytes": result.head_bytes,
                  "grafted_at": time.time(), "original": str(target.folder)}
        if target.mode == "linked":
            return self.store.install(view, target.name, _linked_record(target, view, record))
        folder = target.folder
        os.replace(view / SIDECAR, folder / SIDECAR)
        os.replace(view / "config.json", folder / "config.json")  # the switch: atomic
        marker = self.store.installed_marker(folder)
        if marker is not None:
            files = dict(marker.get("files") or {})
            for rel in (SIDECAR, "config.json"):
                files[rel] = {"size": (folder / rel).stat().st_size}
            summary = {**(marker.get("summary") or {}), "has_mtp": True}
            write_json_atomic(folder / MARKER_DIR / "installed.json",
                              {**marker, "files": files, "summary": summary, "graft": record})
        else:
            write_json_atomic(folder / MARKER_DIR / "graft.json", record)
        return folder


def _tensor_names(path: Path) -> list[str]:
    from engine.models.checkpoint import read_header

    return list(read_header(path))


def link_files(src: Path, dst: Path) -> None:
    """Hard-link (else copy) every file of ``src`` except config.json into ``dst``."""
    from engine.hub.local_models import files_of, link_or_copy

    for rel in files_of(src):
        if rel.as_posix() not in ("config.json", SIDECAR):
            link_or_copy(src / rel, dst / rel, link=True)


def _linked_record(target: Target, view: Path, graft: dict) -> dict:
    from engine.models.checkpoint import read_checkpoint

    ckpt = read_checkpoint(view)
    files = {}
    for dirpath, _dirs, names in os.walk(view):
        for n in names:
            p = Path(dirpath) / n
            if MARKER_DIR not in p.relative_to(view).parts:
                files[p.relative_to(view).as_posix()] = {"size": p.stat().st_size}
    return {"repo_id": None, "revision": None, "imported_from": str(target.folder),
            "location": "graft", "files": files, "graft": graft,
            "summary": {"family": ckpt.config.family, "quantization": ckpt.config.quantization,
                        "has_mtp": True, "layout": ckpt.layout, "supported": True}}


def graft(model: str | Path, **kw) -> GraftResult:
    return Grafter(model, **kw).run()


__all__ = ["GraftError", "GraftResult", "Grafter", "graft", "MIN_ACCEPTANCE", "HubError"]
