"""Every case of ``cases.CASES`` through the real CLI code path, in a child process."""
from __future__ import annotations

import json

import pytest

from tests.reliability.cases import CASES, Case

BY_ID = {c.id: c for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=[f"{c.cls}:{c.id}" for c in CASES])
def test_case(case: Case, batch, world):
    if case.id not in batch:
        pytest.fail(f"the batch process ended before this case: {batch['__batch__']}")
    r = batch[case.id]
    out = r["stderr"] + r["stdout"]
    assert "Traceback" not in out, out
    assert r["rc"] == case.rc, f"exit {r['rc']} (expected {case.rc}):\n{out}"
    if case.rc == 2:
        lines = [ln for ln in r["stderr"].splitlines() if "error:" in ln]
        assert len(lines) == 1, r["stderr"]  # one line (argparse adds its usage above it)
    for word in case.words:
        assert word.lower() in out.lower(), f"{word!r} not in:\n{out}"
    assert r["seconds"] < 60, f"took {r['seconds']} s"
    check = EXTRA.get(case.id)
    if check:
        check(r, world)


def _inspect_refuses(r, world):
    report = json.loads(r["stdout"])
    assert report["supported"] is False and not report["can_speculate"]
    assert report["reasons"]


def _foreign_staging_kept(r, world):
    folder = world["folders"]["convert-keeps-foreign-staging"]
    assert (folder.parent / "m-out.converting" / "precious.txt").read_text() == \
        "not the converter's"
    assert (folder.parent / "m-out" / "config.json").is_file()


def _refused_pulls_not_listed(r, world):
    rows = json.loads(r["stdout"])
    names = {row["name"] for row in rows}
    assert not names & {"tiny--llama", "broken--shape", "broken--heads"}, names
    assert all(not (world["root"] / n).exists() for n in ("tiny--llama", "broken--shape"))
    assert not any(row["loadable"] if "loadable" in row else False for row in rows
                   if row["status"] == "incomplete")


def _gone(r, world):
    assert not (world["root"] / "acme--gone").exists()


def _busy_kept(r, world):
    assert (world["root"] / "acme--busy" / "config.json").is_file()


EXTRA = {c.id: _inspect_refuses for c in CASES if c.args[:1] == ("inspect",) and c.rc == 1}
EXTRA.update({"convert-keeps-foreign-staging": _foreign_staging_kept,
              "list-after-refused-pulls": _refused_pulls_not_listed,
              "rm-while-downloading": _busy_kept, "rm-by-repo-id": _gone})
