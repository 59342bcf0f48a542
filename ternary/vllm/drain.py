"""An ASGI middleware for vLLM's server (`--middleware ternary.vllm.drain.reject_while_draining`,
added by `ternary serve`): once the supervisor has been asked to stop, new API requests get
503 with Retry-After while the requests already in flight finish (vLLM's drain).

vLLM 0.32 answers a request that arrives during its shutdown with 500 ('cannot schedule new
futures after shutdown'). The supervisor (ternary.tools.supervise) creates the file named by
TERNARY_SUPERVISED_DRAINING before it forwards SIGTERM, so the middleware turns those away
first."""

from __future__ import annotations

import os

from ternary import settings


async def reject_while_draining(request, call_next):
    path = settings.raw("TERNARY_SUPERVISED_DRAINING")
    if path and request.url.path.startswith("/v1/") and os.path.exists(path):
        from starlette.responses import JSONResponse

        return JSONResponse(
            {"error": {"message": "the server is shutting down (SIGTERM): retry elsewhere or "
                                  "later", "type": "ServiceUnavailableError", "code": 503}},
            # close: uvicorn's shutdown waits for every open connection, and a keep-alive
            # client that keeps sending would hold it open forever
            status_code=503, headers={"Retry-After": "5", "Connection": "close"})
    return await call_next(request)
