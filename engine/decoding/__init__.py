"""Decoding: every reply is a row of a batch (``decoder.BatchDecoder``), alone or not."""
