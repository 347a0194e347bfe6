"""The mlx-lm internals engine/models/trunk.py relies on, and the pins that keep them there."""
from __future__ import annotations

import tomllib
import types
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import engine  # noqa: F401  (loads the BLAS before mlx)

ROOT = Path(__file__).resolve().parents[3]


def _pins() -> dict[str, Requirement]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {r.name: r for r in map(Requirement, deps)
            if r.name in ("mlx", "mlx-lm") and (r.marker is None or r.marker.evaluate())}


def test_gated_delta_helpers_are_where_the_trunk_reads_them():
    from mlx_lm.models import gated_delta

    from engine.models.trunk import GATED_DELTA_HELPERS

    missing = [n for n in GATED_DELTA_HELPERS if not callable(getattr(gated_delta, n, None))]
    assert not missing, (
        f"mlx-lm {version('mlx-lm')} moved or removed {missing} from mlx_lm.models.gated_delta: "
        "engine/models/trunk.py's capture forward must be ported to the new mlx-lm (same arithmetic "
        "as its GatedDeltaNet) before the pin in pyproject.toml is raised.")


def test_a_moved_helper_gives_a_clear_import_error():
    from mlx_lm.models import gated_delta

    from engine.models.trunk import GATED_DELTA_HELPERS, _gated_delta_helpers

    stripped = types.SimpleNamespace(**{n: getattr(gated_delta, n) for n in GATED_DELTA_HELPERS
                                        if n != "normalize_qk"})
    with pytest.raises(ImportError, match=r"normalize_qk.*mlx-lm>=0\.32\.2,<0\.33"):
        _gated_delta_helpers(stripped)


def test_mlx_and_mlx_lm_are_pinned_to_the_tested_series():
    pins = _pins()
    assert set(pins) == {"mlx", "mlx-lm"}
    for name, req in pins.items():
        assert any(s.operator == "<" for s in req.specifier), f"{name} needs an upper bound"
        assert req.specifier.contains(version(name)), (
            f"installed {name} {version(name)} is outside pyproject.toml's {req.specifier}")
    from engine.models.trunk import MLX_LM_TESTED

    assert str(pins["mlx-lm"].specifier) == ",".join(sorted(MLX_LM_TESTED.split(",")))
