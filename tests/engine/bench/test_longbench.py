"""``bench --context`` and ``bench --reopen`` on a tiny model: the figures are there, the
prefilled state is reused by every decoder, and a reopened chat resumes from disk."""
from __future__ import annotations

from engine.bench.long_context import context_bench, fill_prompt, reopen_bench

TEXTS = ["Explain how a hash table works.", "def hello(name): return f'hello {name}'"]


def test_fill_prompt_is_real_text_of_the_length(tiny_model):
    ids = fill_prompt(tiny_model, 300, TEXTS)
    assert len(ids) == 300 and "hash table" in tiny_model.tokenizer.decode(ids)


def test_context_bench_reports_every_decoder(tiny_model):
    res = context_bench(tiny_model, lengths=[64, 160], depths=[0, 2], texts=TEXTS,
                        max_tokens={64: 6, 160: 6}, replay=True)
    for n in (64, 160):
        assert set(res[n]) == {"prefill mlx_lm", "prefill engine", "mlx_lm", "0", "2"}
        assert all(v > 0 for v in res[n].values())


def test_reopen_bench_resumes_from_disk(tiny_dir, monkeypatch):
    monkeypatch.setenv("MTPCHAT_PROMPT_DISK_CACHE_MIN_TOKENS", "64")
    res = reopen_bench(str(tiny_dir), tokens=200, texts=TEXTS, depths=[0, 2], repeats=1)
    for d in (0, 2):
        assert res[d]["reused_tokens"] == 200 and res[d]["prompt_tokens"] == 224
