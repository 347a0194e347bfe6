from __future__ import annotations

import pytest

from tests.tinymodels import build_tiny_model


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=3)


@pytest.fixture(scope="session")
def tiny_model(tiny_dir):
    import engine

    return engine.load(tiny_dir)


# --------------------------------------------------------------------------- device branch
# The exactness tests below run once per device branch (engine/models/device.py): "cpu" (the
# compiled per-layer functions) and "metal" (mlx-lm's layers and ``gated_delta_update``; on a
# CPU its ops fallback), so the code a Mac runs is checked on a CPU too. Chosen: tests whose
# forwards run in the test body (a module-scoped fixture that computes results, like
# test_reference_parity's ``case``, is computed once on the default branch: its metal check is
# in test_device_branch.py) and that check exact output (greedy parity, seeded bit-identity,
# rollback, structured output, one chi-square). Tests asserting that a compiled function ran
# stay on the default branch. MTPCHAT_TEST_BRANCHES=cpu (comma-separated) narrows the set.
BOTH_BRANCHES = {
    "test_decode.py": (
        "test_greedy_mtp_equals_plain", "test_greedy_exact_across_eos",
        "test_replay_of_target_argmax_is_always_accepted", "test_rollback_state_matches_*",
        "test_sampled_is_reproducible_with_seed", "test_auto_depth_is_exact",
        "test_chunked_prefill_matches_single_pass", "test_closing_the_generator_*",
        "test_cancel_leaves_the_mtp_invariant", "test_every_draft_mode_is_exact_*",
        "test_draft_modes_draw_from_the_q_they_report",
    ),
    "test_batching.py": (
        "test_greedy_batch_equals_each_stream_alone", "test_streams_join_late_*",
        "test_seeded_sampling_is_identical_batched_and_alone",
        "test_rows_drawing_together_*", "test_every_row_matches_a_fresh_decode_*",
        "test_structured_streams_speculate_*", "test_plain_batches_are_pipelined_and_exact",
        "test_a_plain_batch_switches_to_speculation_and_back",
    ),
    "test_reference_parity.py": (
        "test_engine_matches_trainer_reference", "test_oracle_detects_spec_mistakes",
    ),
    "test_grammar.py": (
        "test_greedy_constrained_speculation_*", "test_sampled_constrained_output_*",
        "test_seeded_sampling_with_a_constraint_*",
    ),
    "test_distribution.py": ("test_every_draft_mode_follows_plain_distribution",),
    "test_vision_parity.py": ("test_greedy_mtp_equals_plain_with_images",),
}


def _test_branches() -> tuple[str, ...]:
    import os

    raw = os.environ.get("MTPCHAT_TEST_BRANCHES", "cpu,metal")
    return tuple(b.strip() for b in raw.split(",") if b.strip())


def runs_on_both_branches(module_file: str, name: str) -> bool:
    from fnmatch import fnmatchcase
    from pathlib import Path

    patterns = BOTH_BRANCHES.get(Path(module_file).name, ())
    return any(fnmatchcase(name, p) for p in patterns)


def pytest_generate_tests(metafunc):
    if "device_branch" in metafunc.fixturenames and metafunc.module is not None and \
            runs_on_both_branches(metafunc.module.__file__, metafunc.function.__name__):
        metafunc.parametrize("device_branch", _test_branches(), indirect=True)


@pytest.fixture(autouse=True)
def device_branch(request):
    """The device branch a test runs on: forced for the tests in ``BOTH_BRANCHES`` (one run
    per branch), else None (the environment's or the device's)."""
    name = getattr(request, "param", None)
    if name is None:
        yield None
        return
    from engine.models import device

    with device.use_branch(name):
        yield name
