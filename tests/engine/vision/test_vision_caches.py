"""Images in the one decoder: batched rows equal each stream alone (greedy and seeded
sampling, rows with and without images side by side), and the caches key on image content:
the same ids with other pixels never share a prompt-cache or disk-cache entry, while a
follow-up turn with the same image resumes from the cached prefix without encoding it again.
"""
from __future__ import annotations

import pytest

from engine import SamplingParams
from engine.core.carryover import carryover_of
from engine.decoding import diskcache
from engine.decoding.decoder import BatchDecoder
from tests.engine.vision.conftest import chat


def alone(model, prompt, *, depth, max_tokens=20, **kw):
    carryover_of(model).reset_prompt_cache()
    evs = list(model.generate(prompt, max_tokens=max_tokens, depth=depth, **kw))
    return [t for e in evs for t in e.token_ids], evs[0].prefill.reused_tokens


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_batched_rows_with_images_equal_each_stream_alone(vision_model, images, sampled):
    m = vision_model
    params = SamplingParams(temperature=0.9, top_k=20, top_p=0.95) if sampled \
        else SamplingParams()
    ps = [m.chat_prompt(chat([images[0]])), m.chat_ids(chat([])),
          m.chat_prompt(chat([images[2]], "Describe the picture.")),
          m.chat_prompt(chat([images[0], images[2]], "Compare them.")),
          m.chat_prompt(chat([images[1]]))]
    depths = [0, 2, 3, 1, 2]
    refs = [alone(m, p, depth=d, sampling=params, seed=50 + i)[0]
            for i, (p, d) in enumerate(zip(ps, depths))]
    carryover_of(m).reset_prompt_cache()
    dec = BatchDecoder(m, max_streams=5)
    streams = [dec.add(p, depth=d, max_tokens=20, sampling=params, seed=50 + i)
               for i, (p, d) in enumerate(zip(ps, depths))]
    got = {s.id: [] for s in streams}
    while dec.busy:
        for st, ev in dec.step():
            got[st.id].extend(ev.token_ids)
    for s, ref in zip(streams, refs):
        assert got[s.id] == ref, (s.depth, len(s.images))
    assert refs[0] != refs[4]  # same ids, other pixels: another reply


def test_same_ids_other_pixels_never_share_the_prompt_cache(vision_model, images):
    m = vision_model
    a, b = m.chat_prompt(chat([images[0]])), m.chat_prompt(chat([images[1]]))
    assert list(a) == list(b)
    ref_b, _ = alone(m, b, depth=2)
    carryover_of(m).reset_prompt_cache()
    first = [t for e in m.generate(a, max_tokens=20, depth=2) for t in e.token_ids]
    evs = list(m.generate(b, max_tokens=20, depth=2))  # a's states are in the cache
    assert evs[0].prefill.reused_tokens == 0
    assert [t for e in evs for t in e.token_ids] == ref_b != first


def test_same_ids_other_pixels_never_share_the_disk_cache(vision_model, images, tmp_path,
                                                          monkeypatch):
    m = vision_model
    kinds = {"trunk": diskcache.cache_kinds(m.make_cache()),
             "mtp": diskcache.cache_kinds(m.mtp.make_cache())}
    key = diskcache.model_key(m.info.path, m.info.dtype, [kinds["trunk"], kinds["mtp"]])
    disk = diskcache.DiskPromptCache(tmp_path, key, kinds, max_bytes=1 << 30, min_tokens=8)
    a, b = m.chat_prompt(chat([images[0]])), m.chat_prompt(chat([images[1]]))
    ref_a, _ = alone(m, a, depth=2)
    ref_b, _ = alone(m, b, depth=2)
    monkeypatch.setattr(carryover_of(m), "disk_cache", disk)
    assert alone(m, a, depth=2) == (ref_a, 0)
    disk.flush()
    assert list(disk.dir.glob("*.json"))
    calls = m.vision_stats["calls"]
    assert alone(m, b, depth=2) == (ref_b, 0)   # a's entries on disk: none fits b
    assert m.vision_stats["calls"] == calls + 1
    disk.flush()
    toks, reused = alone(m, a, depth=2)          # a again, from disk: no encoder call
    assert (toks, reused) == (ref_a, len(a))
    assert m.vision_stats["calls"] == calls + 1


def test_a_follow_up_turn_reuses_the_image_prefix(vision_model, images):
    m = vision_model
    turn1 = chat([images[2]], "Describe the picture.")
    p1 = m.chat_prompt(turn1)
    carryover_of(m).reset_prompt_cache()
    reply = [t for e in m.generate(p1, max_tokens=12, depth=2) for t in e.token_ids]
    text = m.tokenizer.decode(reply, skip_special_tokens=True)
    turn2 = turn1 + [{"role": "assistant", "content": text},
                     {"role": "user", "content": "And the colours?"}]
    p2 = m.chat_prompt(turn2)
    image_end = p2.images[0].start + p2.images[0].tokens
    calls = m.vision_stats["calls"]
    evs = list(m.generate(p2, max_tokens=12, depth=2))
    assert m.vision_stats["calls"] == calls          # the image was not encoded again
    assert evs[0].prefill.reused_tokens > image_end
    assert [t for e in evs for t in e.token_ids] == alone(m, p2, depth=2, max_tokens=12)[0]
    assert m.vision_stats["calls"] == calls + 1      # alone, from nothing: encoded once
