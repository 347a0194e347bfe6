"""``pull --convert``: convert a raw Qwen3.5/3.6 checkpoint shard by shard as it downloads.

Peak disk is the converted model plus about one raw shard, not raw plus converted: each raw
shard is fetched (resumably, by :class:`engine.hub.download.Downloader`), converted into its own MLX
shard (written atomically), and deleted; then the next one. The staging folder
``<store>/.partial/<name>/`` holds the converted shards, and ``.mtpchat/`` inside it the raw
files in flight (``raw/``), the tensors that need others from later shards (``deferred-*``:
the MTP head and per-expert MoE weights, small and kept raw) and ``stream_convert.json`` (which
raw shards are done). A killed pull resumes where it stopped: finished shards are neither
downloaded nor converted again. The output matches :func:`engine.models.convert.convert` tensor for
tensor (same renames, conv1d transpose, +1 norm shift, quantization, MTP head at >= 8 bits).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

from engine.errors import ModelLoadError
from engine.hub.client import DownloadResult, RemoteFile
from engine.hub.download import Cancelled, Downloader
from engine.hub.store import MARKER_DIR, model_name, write_json_atomic
from engine.models.checkpoint import parse_config, read_json
from engine.models.convert import COPY_FILES, MTP_MIN_BITS, ConversionError, check_options
from engine.paths import folder_size

log = logging.getLogger(__name__)

STATE_FILE = "stream_convert.json"
NORM_SUFFIXES = (".input_layernorm.weight", ".post_attention_layernorm.weight",
                 "model.norm.weight", ".q_norm.weight", ".k_norm.weight")
DEFERRED_SHARD = "model-deferred.safetensors"
STREAMED_FAMILIES = ("qwen3_5", "qwen3_5_moe")  # the renames below are Qwen3.5's


VISION = "model.visual."


def _is_deferred(key: str) -> bool:
    """Tensors converted only at the end: the MTP head, per-expert MoE weights and the vision
    encoder (kept only when it is whole, as the loader would load it)."""
    parts = key.split(".")
    per_expert = "experts" in parts and parts.index("experts") + 1 < len(parts) \
        and parts[parts.index("experts") + 1].isdigit()
    return key.startswith(("mtp.", VISION)) or per_expert


def _rename(key: str) -> str:
    if key.startswith("model.language_model."):
        return "language_model.model." + key[len("model.language_model."):]
    return key if key.startswith("language_model.") else "language_model." + key


class NotStreamable(ConversionError):
    """The repo's family is not one this module converts shard by shard (its renames are
    Qwen3.5's): ``engine.hub.pull`` then downloads it whole and converts it afterwards."""


class ShardConverter:
    """Raw HF tensors -> MLX-layout tensors, a shard at a time (see the module docstring)."""

    def __init__(self, config: dict, *, bits: int, group_size: int) -> None:
        from engine.models.build import build_trunk

        check_options(bits, group_size)
        self.cfg = parse_config(config)
        if self.cfg.family not in STREAMED_FAMILIES:
            raise NotStreamable(
                f"pull --convert streams Qwen3.5/3.6 checkpoints only, not {self.cfg.family}: "
                "pull without --convert, then run `engine convert` on the folder.")
        self.bits, self.group_size = bits, group_size
        self.tied = bool(self.cfg.text.get("tie_word_embeddings",
                                           config.get("tie_word_embeddings", False)))
        trunk = build_trunk(self.cfg)  # lazy skeleton: which modules can be quantized
        self.quantizable = {p for p, m in trunk.named_modules() if hasattr(m, "to_quantized")}

    def _trunk(self, weights: dict) -> dict:
        out = {}
        for key, v in weights.items():
            if key.startswith(("model.visual", "vision_tower")):
                continue
            key = _rename(key)
            if key.endswith("lm_head.weight") and self.tied:
                continue
            if "conv1d.weight" in key and v.shape[-1] != 1:
                v = v.moveaxis(2, 1)
            if v.ndim == 1 and key.endswith(NORM_SUFFIXES):
                v = v + 1.0
            if key.endswith("mlp.experts.gate_up_proj"):
                base, mid = key[: -len("experts.gate_up_proj")], v.shape[-2] // 2
                out[base + "switch_mlp.gate_proj.weight"] = v[..., :mid, :]
                out[base + "switch_mlp.up_proj.weight"] = v[..., mid:, :]
                continue
            if key.endswith("mlp.experts.down_proj"):
                key = key[: -len("experts.down_proj")] + "switch_mlp.down_proj.weight"
            out[key] = v
        return out

    def _quantize(self, weights: dict, modules: set[str], bits: int, prefix: str = "") -> dict:
        import mlx.core as mx

        out = {}
        for key, v in weights.items():
            path = key[: -len(".weight")] if key.endswith(".weight") else None
            if path and path[len(prefix):] in modules and v.shape[-1] % self.group_size == 0:
                w, s, b = mx.quantize(v, group_size=self.group_size, bits=bits)
                out.update({key: w, f"{path}.scales": s, f"{path}.biases": b})
            else:
                out[key] = v
        return out

    def convert(self, weights: dict) -> dict:
        """One shard's tensors that need no others (call :meth:`finish` for the rest)."""
        now = {k: v for k, v in weights.items() if not _is_deferred(k)}
        return self._quantize(self._trunk(now), self.quantizable, self.bits)

    def finish(self, deferred: dict) -> tuple[dict, dict]:
        """(tensors, quantization config) for the deferred tensors of every shard."""
        from mlx_lm.models.qwen3_5 import TextModelArgs

        from engine.models.build import stack_per_expert
        from engine.models.mtp import MTPHead, sanitize_mtp

        trunk = stack_per_expert({_rename(k): v for k, v in deferred.items()
                                  if not k.startswith(("mtp.", VISION))})
        out = self._quantize(self._trunk(trunk), self.quantizable, self.bits)
        quant: dict = {"group_size": self.group_size, "bits": self.bits}
        mtp_raw = {k: v for k, v in deferred.items() if k.startswith("mtp.")}
        if mtp_raw:
            head = MTPHead(TextModelArgs.from_dict(dict(self.cfg.text)),
                           num_layers=max(self.cfg.mtp_layers, 1))
            mods = {p for p, m in head.named_modules() if hasattr(m, "to_quantized")}
            hbits = max(self.bits, MTP_MIN_BITS)
            mtp = {f"mtp.{k}": v for k, v in sanitize_mtp(mtp_raw, shift_norms=True).items()}
            mtp = self._quantize(mtp, mods, hbits, prefix="mtp.")
            out.update(mtp)
            for k in mtp:
                if k.endswith(".scales"):
                    quant[k[: -len(".scales")]] = {"group_size": self.group_size, "bits": hbits}
        out.update(self._vision({k: v for k, v in deferred.items() if k.startswith(VISION)}))
        return out, quant

    def _vision(self, tensors: dict) -> dict:
        """The vision encoder's tensors as published (float, as ``engine convert`` keeps
        them by default) when the loader would build the encoder from them; none when they
        are absent or a partial stub (``engine.models.families.qwen3_5.build_vision``)."""
        if not tensors:
            return {}
        from engine.models.families.qwen3_5 import build_vision

        encoder, _notes = build_vision(self.cfg, tensors)
        return tensors if encoder is not None else {}


def _save(path: Path, tensors: dict) -> None:
    """Write a safetensors file atomically (a killed process never leaves half of one)."""
    import mlx.core as mx

    tmp = path.with_name(f".{path.name}.tmp.safetensors")
    mx.save_safetensors(str(tmp), tensors, metadata={"format": "mlx"})
    os.replace(tmp, path)


class StreamingConvertPull(Downloader):
    """Download ``repo_id`` and convert it shard by shard into ``<name>-mlx-<bits>bit``."""

    def __init__(self, repo_id: str, *, bits: int = 4, group_size: int = 64, **kw) -> None:
        check_options(bits, group_size)
        revision = kw.get("revision", "main")
        kw.setdefault("name", f"{model_name(repo_id, revision=revision)}-mlx-{bits}bit")
        super().__init__(repo_id, **kw)
        self.bits, self.group_size = bits, group_size
        self.out = self.staging
        self.staging = self.out / MARKER_DIR / "raw"  # where Downloader puts raw files
        self.peak_disk = 0

    # ------------------------------------------------------------------ state
    def _state_path(self) -> Path:
        return self.out / MARKER_DIR / STATE_FILE

    def _load_state(self, commit: str) -> dict:
        try:
            st = json.loads(self._state_path().read_text(encoding="utf-8"))
        except (OSError, ValueError):
            st = {}
        key = {"commit": commit, "bits": self.bits, "group_size": self.group_size}
        if any(st.get(k) != v for k, v in key.items()):
            shutil.rmtree(self.out, ignore_errors=True)  # another commit or options: restart
            st = {**key, "done": []}
        self.out.mkdir(parents=True, exist_ok=True)
        return st

    def _probe_disk(self) -> None:
        self.peak_disk = max(self.peak_disk, folder_size(self.out))

    def _preflight(self, total: int, have: int) -> None:
        """Room for the converted model plus the largest raw shard, not raw plus converted."""
        from engine.hub.client import NotEnoughDiskError
        from engine.hub.download import DISK_MARGIN, format_bytes

        need = int((total * (self.bits + 0.5) / 16 + self._largest) * DISK_MARGIN)
        need -= folder_size(self.out)
        free = self.free_space(self.store.root)
        if need > free:
            raise NotEnoughDiskError(
                f"not enough disk space to download and convert {self.repo_id}: "
                f"{format_bytes(need)} needed, {format_bytes(free)} free on the disk holding "
                f"{self.store.root} — free some space or choose another models folder")

    # ------------------------------------------------------------------ run
    def _run(self, t0: float) -> DownloadResult:
        self._update(phase="planning", message="listing files")
        listing, files = self._plan()
        done = self._up_to_date(listing, files, t0)
        if done is not None:
            return replace(done, converted=True)
        self._check_family(listing)
        state = self._load_state(listing.commit)
        shards = [f for f in files if f.path.endswith(".safetensors")]
        self._largest = max((f.size for f in shards), default=0)
        self.staging.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.out / MARKER_DIR / "download.json",
                          {"repo_id": self.repo_id, "revision": self.revision,
                           "files": [{"path": f.path, "size": f.size} for f in files]})
        total = sum(f.size for f in files)
        have = self._reconcile(listing, files) + sum(f.size for f in shards
                                                     if f.path in state["done"])
        self._update(bytes_total=total, bytes_done=have, resumed_bytes=have,
                     files_total=len(files), message="")
        self._preflight(total, have)
        self._last_byte = time.monotonic()
        self._update(phase="downloading")
        for f in [f for f in files if f not in shards]:
            if not (self.staging / f.path).is_file():
                self._fetch_file(f, listing.commit)
        self._check_config()
        conv = ShardConverter(read_json(self.staging / "config.json", "config.json"),
                              bits=self.bits, group_size=self.group_size)
        for i, f in enumerate(shards):
            if self.cancel.is_set():
                raise Cancelled
            if f.path not in state["done"]:
                self._one_shard(conv, f, i, len(shards), listing.commit, state)
        return self._finish(conv, listing, files, state, total, have, t0)

    def _check_family(self, listing) -> None:
        """Refuse a family this module cannot stream before anything is written (one small
        request for config.json); a config it cannot read is left to the later checks."""
        from engine.hub.remote import remote_json

        try:
            config = remote_json(self.repo_id, listing, "config.json", self.token)[0]
            family = parse_config(config).family if config else None
        except ModelLoadError:
            return
        if family and family not in STREAMED_FAMILIES:
            raise NotStreamable(f"{self.repo_id} is {family}: not streamed")

    def _one_shard(self, conv: ShardConverter, f: RemoteFile, i: int, n: int, commit: str,
                   state: dict) -> None:
        import mlx.core as mx

        self._update(phase="downloading", message=f"shard {i + 1}/{n}: downloading")
        if not (self.staging / f.path).is_file():
            self._fetch_file(f, commit)
        self._probe_disk()
        self._update(phase="converting", message=f"shard {i + 1}/{n}: converting")
        raw = mx.load(str(self.staging / f.path))
        deferred = {k: v for k, v in raw.items() if _is_deferred(k)}
        if deferred:
            _save(self.out / MARKER_DIR / f"deferred-{i:05d}.safetensors", deferred)
        out = conv.convert(raw)
        if out:
            mx.eval(out)
            _save(self.out / f"model-{i + 1:05d}-of-{n:05d}.safetensors", out)
        self._probe_disk()
        state["done"].append(f.path)
        write_json_atomic(self._state_path(), state)
        (self.staging / f.path).unlink()  # the raw shard is no longer needed
        self._update(files_done=self._state.files_done + 1)

    def _finish(self, conv: ShardConverter, listing, files, state: dict, total: int, have: int,
                t0: float) -> DownloadResult:
        import mlx.core as mx

        self._update(phase="converting", message="converting the MTP head")
        marker = self.out / MARKER_DIR
        deferred: dict = {}
        for p in sorted(marker.glob("deferred-*.safetensors")):
            deferred.update(mx.load(str(p)))
        rest, quant = conv.finish(deferred)
        if rest:
            mx.eval(rest)
            _save(self.out / DEFERRED_SHARD, rest)
        self._write_config(quant)
        self._probe_disk()
        shutil.rmtree(self.staging, ignore_errors=True)
        for p in marker.glob("deferred-*.safetensors"):
            p.unlink()
        record = self._converted_record(listing, quant)
        self._update(phase="installing", message="installing")
        dest = self.store.install(self.out, self.name, record)
        self._update(phase="done", message=f"installed in {dest}")
        return DownloadResult(self.repo_id, self.name, "installed", str(dest), total,
                              self._fetched, have, time.monotonic() - t0, converted=True,
                              notes=(f"peak disk {self.peak_disk} bytes",))

    def _write_config(self, quant: dict) -> None:
        from safetensors import safe_open

        config = read_json(self.staging / "config.json", "config.json")
        config.pop("quantization_config", None)
        config["quantization"] = quant
        config["mtpchat_converted_from"] = f"{self.repo_id}@{self.revision}"
        wm = {}
        for p in sorted(self.out.glob("model-*.safetensors")):
            with safe_open(str(p), framework="numpy") as fh:
                wm.update({k: p.name for k in fh.keys()})  # noqa: SIM118 - not a dict
        (self.out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": wm}, indent=1))
        (self.out / "config.json").write_text(json.dumps(config, indent=2))
        for name in COPY_FILES:
            if (self.staging / name).is_file():
                shutil.copy2(self.staging / name, self.out / name)

    def _same_install(self, marker: dict, listing, files) -> bool:
        """Converted from this commit with these options (its files are the converted ones)."""
        return (marker.get("repo_id") == self.repo_id and marker.get("commit") == listing.commit
                and marker.get("bits") == self.bits and marker.get("group_size") == self.group_size)

    def _converted_record(self, listing, quant: dict) -> dict:
        from engine.errors import HubError
        from engine.hub.inspection import inspect_local

        info = inspect_local(self.out)
        if not info["supported"]:
            raise HubError(f"the converted model does not load: {'; '.join(info['reasons'])}")
        files = {str(p.relative_to(self.out)): {"size": p.stat().st_size}
                 for p in self.out.rglob("*") if p.is_file() and MARKER_DIR not in p.parts}
        return {"repo_id": self.repo_id, "revision": self.revision, "commit": listing.commit,
                "bits": self.bits, "group_size": self.group_size, "streamed": True,
                "files": files, "peak_disk_bytes": self.peak_disk,
                "summary": {k: info.get(k) for k in ("family", "quantization", "has_mtp",
                                                     "layout", "parameters", "supported")}}


__all__ = ["ShardConverter", "StreamingConvertPull"]
