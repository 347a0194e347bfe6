"""Trainer for the embedded demo model (``python -m engine train-demo``).

Needs the ``train`` extra (PyTorch). The trunk is transformers' own Qwen3.5 text model; the MTP
head follows ``MTP_SPEC.md`` §2. Submodules:

- ``corpus``: question/answer chats built from the Python standard library's docstrings.
- ``tokenizer``: a byte-level BPE with the Qwen chat tokens and a Qwen-style chat template
  (merges from ``bpe``, a deterministic trainer).
- ``model``: the trunk + MTP head in torch and the sizes of the shipped/tiny configurations.
- ``trainer``: the training loop (joint phase, then MTP distillation on the frozen trunk).
- ``export``: writes the raw Hugging Face layout (``Qwen3_5ForConditionalGeneration``).
- ``reference``: float32 torch logits from an exported folder (parity oracle for the engine).
- ``acceptance``: greedy MTP acceptance of the torch head against its own trunk.
- ``readme``: the model folder's README.md, written from the measured training summary.

Nothing here is imported by ``engine`` at runtime: torch is optional for the app.
"""
from __future__ import annotations
