"""Weight products in column blocks for OpenBLAS's small kernel (engine/models/cpu_products.py)."""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from engine.models import cpu_products as cp


@pytest.fixture
def blocks_on(monkeypatch):
    monkeypatch.setitem(cp._state, "on", True)


@pytest.fixture
def one_thread(monkeypatch):
    monkeypatch.setitem(cp._state, "threads", 1)


def test_block_width_keeps_every_block_inside_the_permit(one_thread):
    assert cp.block_width(1, 512, 192) is None      # 512 columns: the whole product passes
    assert cp.block_width(4, 512, 192) == 256       # 2048 > 1200: blocks of 256 (1024 each)
    assert cp.block_width(1, 4096, 192) == 1024     # the demo's LM head, one row
    assert cp.block_width(4, 4096, 192) == 256
    assert cp.block_width(1, 6144, 1024) == 512     # rows x cols x inner <= 100**3 too
    assert cp.block_width(65, 2048, 1024) is None   # more rows than MAX_ROWS: whole
    assert cp.block_width(48, 2048, 1024) == 16     # 16 x 1024 is enough work a block
    assert cp.block_width(8, 4096, 192) == 128
    assert cp.block_width(32, 4096, 192) is None    # blocks of 32 x 192: too little work each
    assert cp.block_width(16, 2048, 1024) == 32
    assert cp.block_width(2, 512, 16) is None       # the small kernel refuses inner < 32
    for rows in range(1, cp.MAX_ROWS + 1):
        for cols, inner in ((512, 192), (4096, 192), (6144, 1024), (2048, 1024)):
            w = cp.block_width(rows, cols, inner)
            if w is not None:
                assert rows * w <= cp.MAX_RN and rows * w * inner <= cp.MAX_RNK
                assert w * inner >= cp.MIN_BLOCK_WORK


def test_with_more_than_two_threads_only_products_openblas_keeps_on_one_are_blocked(monkeypatch):
    monkeypatch.setitem(cp._state, "threads", 16)
    assert cp.block_width(1, 6144, 1024) is None    # 6.3M multiply-adds: OpenBLAS threads it
    assert cp.block_width(4, 512, 192) is None      # 393k: above OpenBLAS's serial limit
    assert cp.block_width(2, 2048, 64) == 512       # 262k: OpenBLAS runs it on one thread
    assert cp.block_width(1, 1024, 192) is None     # already within the permit


@pytest.mark.parametrize("cols,inner", [(512, 192), (4096, 192), (1024, 192), (576, 192),
                                        (192, 512), (1000, 64)])
def test_blocked_product_is_the_product_and_a_row_is_the_same_bits_in_any_batch(
        cols, inner, one_thread):
    rng = np.random.default_rng(cols + inner)
    w = mx.array(rng.normal(size=(cols, inner)).astype(np.float32))
    x = mx.array(rng.normal(size=(cp.MAX_ROWS, inner)).astype(np.float32))
    whole = np.array(x @ w.T)
    # Another summation order may differ by float32 rounding, which scales with the sum of
    # |x_i w_i| (not with the result, which cancels); a wrong block would be off by that sum.
    scale = np.abs(np.array(x, np.float64)) @ np.abs(np.array(w, np.float64)).T
    bound = 8 * np.finfo(np.float32).eps * np.sqrt(inner) * scale
    for rows in range(1, cp.MAX_ROWS + 1):
        got = np.array(cp.product(x[:rows], w))
        assert np.all(np.abs(got - whole[:rows]) <= bound[:rows]), rows
    if cp.core_name() not in cp.SMALL_KERNEL_CORES:
        pytest.skip(f"bit-identity is the small kernel's; this BLAS core: {cp.core_name()!r}")
    alone = [np.array(cp.product(x[r:r + 1], w)) for r in range(cp.MAX_ROWS)]
    checked = [rows for rows in range(2, cp.MAX_ROWS + 1) if cp.small_kernel(rows, cols, inner)]
    assert cp.small_kernel(1, cols, inner) and 2 in checked
    for rows in checked:
        got = np.array(cp.product(x[:rows], w))
        for r in range(rows):
            assert np.array_equal(got[r:r + 1], alone[r]), (rows, r)


def test_adopt_swaps_plain_layers_only_and_keeps_their_weights(blocks_on):
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(64, 32)
            self.proj = nn.Linear(32, 600, bias=False)
            self.biased = nn.Linear(32, 40)
            self.quant = nn.QuantizedLinear(64, 64, bias=False)

    m = Block()
    before = {k: v for k, v in m.parameters().items()}
    x = mx.random.normal((4, 32), key=mx.random.key(0))
    want = (m.proj(x), m.biased(x), m.embed.as_linear(x))
    assert cp.adopt(m) == 3
    assert type(m.proj) is cp.BlockLinear and type(m.biased) is cp.BlockLinear
    assert type(m.embed) is cp.BlockEmbedding and type(m.quant) is nn.QuantizedLinear
    assert m.parameters().keys() == before.keys()
    assert m.proj.weight is before["proj"]["weight"]
    for a, b in zip((m.proj(x), m.biased(x), m.embed.as_linear(x)), want):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=2e-5, atol=2e-5)


def test_adopt_changes_nothing_where_blocks_and_columns_are_off(monkeypatch):
    monkeypatch.setitem(cp._state, "on", False)
    monkeypatch.setitem(cp._state, "columns", False)
    lin, emb = nn.Linear(8, 8), nn.Embedding(16, 8)
    w = lin.weight
    assert cp.adopt(lin) == 0 and cp.adopt(emb) == 0
    assert type(lin) is nn.Linear and type(emb) is nn.Embedding and lin.weight is w


@pytest.fixture
def columns_on(monkeypatch):
    monkeypatch.setitem(cp._state, "on", False)
    monkeypatch.setitem(cp._state, "columns", True)


def test_columns_keep_every_weight_and_product_and_copy_only_a_small_tied_head(
        columns_on, monkeypatch):
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(64, 32)
            self.big = nn.Embedding(300, 32)
            self.proj = nn.Linear(32, 600, bias=False)
            self.biased = nn.Linear(32, 40)
            self.quant = nn.QuantizedLinear(64, 64, bias=False)

    m = Block()
    monkeypatch.setattr(cp, "TIED_COPY_MAX", 64 * 32 * 4)   # the 64-row head fits, not 300
    before = {k: {n: np.array(a) for n, a in v.items()} for k, v in m.parameters().items()}
    x = mx.random.normal((5, 32), key=mx.random.key(1))
    ids = mx.array([[3, 0, 63]])
    want = (m.proj(x), m.biased(x), m.embed.as_linear(x), m.big.as_linear(x), m.embed(ids))
    assert cp.adopt(m, head=m.embed) == 3
    assert type(m.proj) is nn.Linear and type(m.biased) is nn.Linear
    assert type(m.embed) is cp.ColumnEmbedding and type(m.big) is nn.Embedding
    big = Block()
    assert cp.adopt(big) == 2 and type(big.embed) is nn.Embedding  # not the head: no copy
    assert cp.adopt(big, head=big.big) == 2 and type(big.big) is nn.Embedding  # over the limit
    assert type(m.quant) is nn.QuantizedLinear
    after = m.parameters()
    assert after.keys() == before.keys()
    for k, v in before.items():
        assert after[k].keys() == v.keys()  # the copy is not a parameter
        for n, a in v.items():
            assert after[k][n].shape == a.shape and np.array_equal(np.array(after[k][n]), a)
    assert [c.shape for c in cp.copies(m)] == [(32, 64)]
    got = (m.proj(x), m.biased(x), m.embed.as_linear(x), m.big.as_linear(x), m.embed(ids))
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=2e-5, atol=2e-5)
    assert np.array_equal(np.array(got[-1]), np.array(want[-1]))  # the lookup reads rows


def test_columns_leave_half_precision_weights_as_they_are(columns_on):
    lin, emb = nn.Linear(8, 8, bias=False), nn.Embedding(16, 8)
    lin.weight, emb.weight = lin.weight.astype(mx.bfloat16), emb.weight.astype(mx.float16)
    w = lin.weight
    assert cp.adopt(lin) == 0 and cp.adopt(emb, head=emb) == 0
    assert lin.weight is w and type(emb) is nn.Embedding
    assert cp.laid_out(w) is w


def test_columns_never_with_blocks_and_the_environment_decides(monkeypatch):
    monkeypatch.setitem(cp._state, "on", True)
    monkeypatch.setitem(cp._state, "columns", True)
    assert not cp.columns_enabled()
    monkeypatch.setitem(cp._state, "on", False)
    for value, want in (("0", False), ("off", False), ("1", True), ("yes", True)):
        cp._state.pop("columns")
        monkeypatch.setenv(cp.COLUMNS_ENV, value)
        assert cp.columns_enabled() is want
    cp._state.pop("columns")
    monkeypatch.delenv(cp.COLUMNS_ENV)
    monkeypatch.setattr(cp, "core_name", lambda: "")      # not OpenBLAS: nothing changes
    assert not cp.columns_enabled()
    cp._state.pop("columns")
    monkeypatch.setattr(cp, "core_name", lambda: "haswell")
    assert cp.columns_enabled() is (mx.default_device() == mx.cpu)
    cp._state.pop("columns")


def test_an_unknown_value_is_named_in_one_warning(monkeypatch, caplog):
    monkeypatch.delitem(cp._state, "on", raising=False)
    monkeypatch.setenv(cp.ENV, "maybe")
    cp.enabled()
    cp._state.pop("on")
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "MTPCHAT_BLOCK_PRODUCTS='maybe' is not 0 or 1; deciding by the BLAS"]


def test_the_environment_decides(monkeypatch):
    monkeypatch.delitem(cp._state, "on", raising=False)
    monkeypatch.setenv(cp.ENV, "0")
    assert not cp.enabled()
    cp._state.pop("on")
    monkeypatch.setenv(cp.ENV, "1")
    assert cp.enabled()
    cp._state.pop("on")
