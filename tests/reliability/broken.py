"""Ways to break a model folder: each function edits a private copy in place."""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np


def edit_config(folder: Path, fn) -> None:
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    fn(cfg)
    path.write_text(json.dumps(cfg))


def set_text(**fields):
    def edit(folder: Path) -> None:
        edit_config(folder, lambda c: c["text_config"].update(fields))
    return edit


def set_top(**fields):
    def edit(folder: Path) -> None:
        edit_config(folder, lambda c: c.update(fields))
    return edit


def set_generation(**fields):
    def edit(folder: Path) -> None:
        path = folder / "generation_config.json"
        cfg = json.loads(path.read_text())
        cfg.update(fields)
        path.write_text(json.dumps(cfg))
    return edit


def shard(folder: Path) -> Path:
    return sorted(folder.glob("*.safetensors"))[0]


def replace_header(folder: Path, header_bytes: bytes) -> None:
    """Swap the first shard's JSON header for ``header_bytes`` (data kept after it)."""
    path = shard(folder)
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    path.write_bytes(struct.pack("<Q", len(header_bytes)) + header_bytes + data[8 + n:])


def edit_header(fn):
    def edit(folder: Path) -> None:
        data = shard(folder).read_bytes()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        fn(header)
        replace_header(folder, json.dumps(header).encode())
    return edit


def header_list(folder: Path) -> None:
    replace_header(folder, b'[{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}]')


def header_nested(folder: Path) -> None:
    replace_header(folder, b"[" * 100_000 + b"]" * 100_000)


def truncate_shard(folder: Path) -> None:
    path = shard(folder)
    os.truncate(path, path.stat().st_size * 2 // 3)


def _rewrite_tensors(folder: Path, fn) -> None:
    from safetensors.numpy import load_file, save_file

    path = shard(folder)
    tensors = load_file(str(path))
    fn(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def drop_tensor(folder: Path) -> None:
    _rewrite_tensors(folder, lambda t: t.pop(
        "model.language_model.layers.1.mlp.down_proj.weight"))


def wrong_shape(folder: Path) -> None:
    key = "model.language_model.layers.1.mlp.down_proj.weight"
    _rewrite_tensors(folder, lambda t: t.update({key: np.zeros((8, 8), np.float32)}))


def index_entry(value):
    """Point one weight_map entry of a sharded model at ``value``."""
    def edit(folder: Path) -> None:
        path = folder / "model.safetensors.index.json"
        index = json.loads(path.read_text())
        first = sorted(index["weight_map"])[0]
        index["weight_map"][first] = value
        path.write_text(json.dumps(index))
    return edit


def index_symlink_outside(folder: Path) -> None:
    """A shard named in the index is a symlink to a file outside the model folder."""
    outside = folder.parent / f"{folder.name}-outside.safetensors"
    target = sorted(folder.glob("*.safetensors"))[0]
    os.replace(target, outside)
    target.symlink_to(outside)


def remove(*names: str):
    def edit(folder: Path) -> None:
        for n in names:
            (folder / n).unlink()
    return edit


def chat_template(text: str):
    def edit(folder: Path) -> None:
        path = folder / "tokenizer_config.json"
        cfg = json.loads(path.read_text())
        cfg["chat_template"] = text
        path.write_text(json.dumps(cfg))
    return edit


def both(*edits):
    def edit(folder: Path) -> None:
        for e in edits:
            e(folder)
    return edit


def shard_to_dev_zero(folder: Path) -> None:
    path = shard(folder)
    path.unlink()
    path.symlink_to("/dev/zero")


def foreign_converting_folder(folder: Path) -> None:
    """Someone else's ``<DST>.converting`` folder beside ``<folder>-out``."""
    other = folder.parent / f"{folder.name}-out.converting"
    other.mkdir()
    (other / "precious.txt").write_text("not the converter's")


def index_dotdot_to_a_real_shard(folder: Path) -> None:
    """The index sends one tensor to ``../outside.safetensors``, a real (loadable) shard."""
    import shutil

    index = json.loads((folder / "model.safetensors.index.json").read_text())
    name = sorted(index["weight_map"])[0]
    shutil.copy(folder / index["weight_map"][name], folder.parent / "outside.safetensors")
    index_entry("../outside.safetensors")(folder)
