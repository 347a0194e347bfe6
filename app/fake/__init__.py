"""A scripted stand-in for the engine (no weights, deterministic output), for the app's tests,
``python -m app.bench.ui`` and the self-test with ``MTPCHAT_SELFTEST_FAKE=1``:
``app.fake.engine`` (``FakeModel``, ``make_fake_loader``) over ``app.fake.decoder``
(``ScriptedDecoder``: the decoder protocol of ``engine.decoding.decoder.BatchDecoder`` over
scripted event streams)."""
