"""Images in the engine (issue 32): Qwen3.5/3.6's vision encoder, its preprocessing and M-RoPE.

The contract with the app (``engine/vision/image_io.py`` decodes the files both use):

- ``engine.vision.image_io.decode_image(data: bytes, limits: ImageLimits | None = None)
  -> DecodedImage`` turns untrusted bytes into ``DecodedImage(pixels, digest)``: ``pixels``
  (H, W, 3) uint8 RGB with EXIF rotation applied, ``digest`` the sha256 of shape + pixels.
  Every bad input raises ``ImageError`` (a ``ValueError``) with a one-line message.
- A chat message's ``content`` may be a list of parts: ``{"type": "text", "text": str}`` and
  ``{"type": "image", "image": DecodedImage}``. ``Model.chat_prompt(messages)`` renders them
  through the model's chat template (Qwen3.5's emits ``<|vision_start|><|image_pad|>
  <|vision_end|>`` per image part) and returns an ``engine.vision.prompt.ImagePrompt``:
  the token ids with each image's pad expanded to its token count, plus the images placed
  at their first pad (``PlacedImage(start, tokens, image)``). Pass it where token ids go
  (``Model.generate``, ``BatchDecoder.add``, the scheduler): a plain ``list[int]`` prompt
  is the text-only path, unchanged.
- ``ModelInfo.vision`` is True when the checkpoint carries a vision encoder the engine
  loaded; the app and the server refuse images for a model without one
  (``engine.vision.prompt.NoVisionError``, a ``GenerationError``).
- Caches key on image content: two prompts whose ids are equal but whose images differ
  (``DecodedImage.digest``) never share a prompt-cache or disk-cache entry; a follow-up turn
  with the same images reuses the cached prefix (the encoder does not run again).

Modules (imported lazily: a text-only chat never imports them):
``preprocess`` (resize to the pixel budget on the patch grid, normalize, patchify: numpy),
``encoder`` (the vision tower in MLX, same math as transformers' ``Qwen3_5VisionModel``),
``positions`` (M-RoPE position ids and the rotation), ``prompt`` (ImagePrompt, rendering),
``prefill`` (the trunk and MTP head over a prompt whose image pads carry image embeddings).
"""
