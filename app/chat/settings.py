"""Per-chat generation settings and the app-wide defaults they start from (plain data)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from engine.types import MAX_DEPTH, SamplingParams

DEPTH_CHOICES: tuple[int | str, ...] = ("auto", *range(MAX_DEPTH + 1))
MAX_NUMBER = 2**31 - 1  # a numeric setting above this (a Qt spin box's int) is a damaged one


@dataclass(frozen=True)
class ChatSettings:
    """What one conversation generates with. ``depth`` is "auto" or 0..MAX_DEPTH (0 = no speculation)."""

    system_prompt: str = ""
    temperature: float = 0.7
    top_p: float = 0.8
    top_k: int = 20
    max_tokens: int = 2048
    depth: int | str = "auto"
    thinking: bool = False

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=max(0.0, self.temperature),
                              top_p=min(1.0, max(0.01, self.top_p)), top_k=max(0, self.top_k))

    def depth_for(self, info) -> int | str:
        """The depth to request from a model: no MTP means 0; fixed depths capped at its max."""
        if info is None or not getattr(info, "has_mtp", False):
            return 0
        if self.depth == "auto":
            return "auto"
        return max(0, min(int(self.depth), int(info.max_depth or 0)))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None, *, base: ChatSettings | None = None) -> ChatSettings:
        """Tolerant: unknown keys are ignored, bad values fall back to ``base`` (or defaults)."""
        return cls.parse(data, base=base)[0]

    @classmethod
    def parse(cls, data: dict | None, *, base: ChatSettings | None = None
              ) -> tuple[ChatSettings, list[str]]:
        """``from_dict``, and the keys whose values were bad (not a number, not finite, out of
        any usable range: e.g. ``top_k: 1e300``) and fell back."""
        out = base or cls()
        if not isinstance(data, dict) or not data:
            return out, ([] if not data else ["all"])
        known = {f.name for f in fields(cls)}
        clean, bad = {}, []
        for key, value in data.items():
            if key not in known:
                continue
            try:
                clean[key] = _coerce(key, value, getattr(out, key))
            except (TypeError, ValueError, OverflowError):
                bad.append(key)
        return replace(out, **clean), bad


def _coerce(key: str, value, default):
    if key == "depth":
        if value == "auto":
            return "auto"
        v = int(value)
        if not 0 <= v <= MAX_DEPTH:
            raise ValueError(key)
        return v
    if isinstance(default, bool):
        return bool(value)
    if isinstance(default, (int, float)):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise TypeError(key)
        v = float(value)
        if not 0 <= v <= MAX_NUMBER:  # NaN, infinities and 1e300 too: no widget holds them
            raise ValueError(key)
        return int(v) if isinstance(default, int) else v
    if not isinstance(value, str):
        raise TypeError(key)
    return value
