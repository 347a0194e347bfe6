"""A small OpenAI-compatible server that is not MTP Chat, for the remote-model tests: a real
process (``python -m tests.app.fake_openai --port N``) on 127.0.0.1 serving one model whose
streamed replies are ``word0 word1 …`` (``--words`` of them, ``--delay`` seconds apart), with
usage but no ``mtp`` stats; ``--think`` sends ``reasoning_content`` first, and a request with
``tools`` gets one streamed call of the first tool. It prints ``ready`` once it listens and ``closed N`` when a client
closed a reply's stream after N words."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

MODEL = "plain-model"


def build(words: int, delay: float, think: bool = False) -> Starlette:
    async def models(_request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [
            {"id": MODEL, "object": "model", "created": 0, "owned_by": "someone"}]})

    async def chat(request: Request):
        body = await request.json()
        meta = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": MODEL}

        def chunk(delta: dict, finish=None, **extra) -> str:
            return "data: " + json.dumps({**meta, "choices": [
                {"index": 0, "delta": delta, "finish_reason": finish}], **extra}) + "\n\n"

        async def events():
            sent = 0
            try:
                yield chunk({"role": "assistant", "content": ""})
                if body.get("tools"):  # one call of the first tool, its arguments in two parts
                    name = body["tools"][0]["function"]["name"]
                    yield chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                 "function": {"name": name, "arguments": ""}}]})
                    for part in ('{"path": ', '"notes.md"}'):
                        yield chunk({"tool_calls": [{"index": 0,
                                                     "function": {"arguments": part}}]})
                    yield chunk({}, "tool_calls")
                    yield "data: [DONE]\n\n"
                    return
                if think:
                    for part in ("Let me ", "think."):
                        yield chunk({"reasoning_content": part})
                for i in range(min(words, int(body.get("max_tokens") or words))):
                    await asyncio.sleep(delay)
                    yield chunk({"content": f"word{i} "})
                    sent += 1
                yield chunk({}, "stop")
                if (body.get("stream_options") or {}).get("include_usage"):
                    yield "data: " + json.dumps({**meta, "choices": [], "usage": {
                        "prompt_tokens": 5, "completion_tokens": sent,
                        "total_tokens": sent + 5}}) + "\n\n"
                yield "data: [DONE]\n\n"
            except asyncio.CancelledError:
                print(f"closed {sent}", flush=True)
                raise

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat,
                                                                methods=["POST"])])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--words", type=int, default=20)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--think", action="store_true", help="reasoning_content before the words")
    a = p.parse_args()
    config = uvicorn.Config(build(a.words, a.delay, a.think), host="127.0.0.1", port=a.port,
                            log_level="warning")
    server = uvicorn.Server(config)

    async def run() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.02)
        print("ready", flush=True)
        await task

    asyncio.run(run())
    sys.exit(0)


if __name__ == "__main__":
    main()
