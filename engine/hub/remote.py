"""A Hub repo's small files, read without downloading its weights: a safetensors file's header
by byte ranges, and its JSON files (config, index), each bounded as the local reader bounds them.
``engine.hub.inspection`` (the verdicts) and ``engine.hub.graft_source`` (a graft's source)
read through here."""
from __future__ import annotations

import struct

from engine.errors import ModelLoadError
from engine.models import checkpoint


def remote_header(repo_id: str, fname: str, revision: str, token: str | None,
                  size: int) -> tuple[bytes, dict]:
    """(the header's bytes, its tensors) of a safetensors file on the Hub, read by byte
    ranges (``size``: the file's, to catch one truncated on the server; 0: unknown)."""
    from engine.hub import client as hub

    head = hub.fetch_bytes(repo_id, fname, revision=revision, token=token, byte_range=(0, 7))
    (n,) = struct.unpack("<Q", head[:8]) if len(head) >= 8 else (0,)
    if n > checkpoint.MAX_HEADER or len(head) < 8:
        checkpoint.parse_header(head[:8], name=fname)  # raises with the reason
    body = hub.fetch_bytes(repo_id, fname, revision=revision, token=token, byte_range=(8, 7 + n))
    blob = head[:8] + body[:n]
    tensors = checkpoint.parse_header(blob, name=fname)
    if size and 8 + n + checkpoint.header_data_end(tensors) > size:
        raise ModelLoadError(f"{fname} of {repo_id} is truncated on the server ({size} bytes, "
                             f"its header needs {8 + n + checkpoint.header_data_end(tensors)}).")
    return blob, tensors


def remote_json(repo_id: str, listing, name: str, token: str | None) -> tuple[dict, int]:
    """(a JSON file of a Hub repo, the bytes read); ({}, 0) when the repo has no such file."""
    from engine.hub import client as hub

    f = listing.file(name)
    if f is None:
        return {}, 0
    if f.size > checkpoint.MAX_JSON_BYTES:
        raise ModelLoadError(f"{name} of {repo_id} is implausibly large ({f.size} bytes).")
    data = hub.fetch_bytes(repo_id, name, revision=listing.commit, token=token)
    return checkpoint.loads_json(data[:checkpoint.MAX_JSON_BYTES + 1], what=name), len(data)
