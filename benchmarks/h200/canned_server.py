"""A canned OpenAI-style SSE server with a perfect engine: what HTTP and the bench client alone add to TTFP.

Headers at once, text at 0.05 s, a 4-frame audio chunk at 0.30 s after the request, then four 25-frame
chunks 0.5 s apart (the shape of the H200 replies), usage, [DONE]. Any TTFP the bench measures above
0.30 s is the two event loops' (this server's and the client's):

    python benchmarks/h200/canned_server.py &   # port 8765
    python -m voice_gateway.cli bench --url http://127.0.0.1:8765 --concurrency 64 --client-processes 1
"""
import asyncio
import base64
import json

import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

SMALL = base64.b64encode(np.zeros(4 * 1920, np.int16).tobytes()).decode()
BIG = base64.b64encode(np.zeros(25 * 1920, np.int16).tobytes()).decode()

def chunk(delta, finish=None, usage=None):
    body = {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage: body["usage"] = usage
    return f"data: {json.dumps(body)}\n\n"

async def chat(request):
    await request.json()
    async def gen():
        await asyncio.sleep(0.05); yield chunk({"content": "Hello"})
        await asyncio.sleep(0.25); yield chunk({"audio": {"id": "a", "data": SMALL, "transcript": "x"}})
        for _ in range(4):
            await asyncio.sleep(0.5); yield chunk({"audio": {"id": "a", "data": BIG}})
        yield chunk({}, finish="stop")
        yield chunk({}, usage={"prompt_tokens": 1, "completion_tokens": 5, "completion_tokens_details": {"audio_tokens": 104}})
        yield "data: [DONE]\n\n"
    return StreamingResponse(gen(), media_type="text/event-stream")

async def models(request):
    return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/models", models)])
uvicorn.run(app, host="127.0.0.1", port=8765, log_level="warning")
