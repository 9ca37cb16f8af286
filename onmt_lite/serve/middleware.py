"""The server's ASGI middleware: bounded bodies (BodyLimit), a bound on requests in flight
(InFlight), each request measured into the metrics (Measure), and the client's disconnect
(disconnected), which uvicorn leaves to the application to notice."""
import asyncio
import time
from typing import Optional

from fastapi.responses import JSONResponse


class BodyLimit:
    """ASGI middleware: a body over ``limit`` bytes gets 413, whether it announces its length
    or streams it in chunks (neither uvicorn nor Starlette bounds a body).

    Most clients (urllib, requests) send the whole body before they read the answer, and closing
    a connection that still holds unread bytes resets it: such a client would never see the 413.
    So the rest of the body is read and dropped first, up to ``discard`` bytes in all and for at
    most ``discard_s`` seconds (a body that announces more, or waits for ``Expect:
    100-continue``, is answered at once); the 413 says ``Connection: close``, so that an endless
    body holds its connection no longer than that."""

    def __init__(self, app, limit: int, discard: Optional[int] = None, discard_s: float = 10.0):
        self.app, self.limit, self.discard_s = app, limit, discard_s
        self.discard = max(16 * limit, 16 << 20) if discard is None else discard

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        announced = int(length) if length is not None and length.isdigit() else None
        too_big = announced is not None and announced > self.limit
        chunks, size, more = [], 0, True
        while more and not too_big:
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, replay([message], receive), send)
            chunks.append(message)
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
            too_big = size > self.limit
        if too_big:
            chunks.clear()
            waits = headers.get(b"expect", b"").lower() == b"100-continue" and size == 0
            if more and not waits and (announced or 0) <= self.discard:
                await self._drop_rest(receive, size)
            error = JSONResponse({"error": f"the request body is over {self.limit} bytes "
                                           "(-max_request_bytes)"}, status_code=413,
                                 headers={"Connection": "close"})
            return await error(scope, receive, send)
        await self.app(scope, replay(chunks, receive), send)

    async def _drop_rest(self, receive, size: int) -> None:
        """Reads the body's remaining messages, dropping them, until its end, a disconnect,
        ``discard`` bytes read in all or ``discard_s`` seconds."""
        async def drop(size: int) -> None:
            while size <= self.discard:
                message = await receive()
                if message["type"] != "http.request" or not message.get("more_body"):
                    return
                size += len(message.get("body", b""))
        try:
            await asyncio.wait_for(drop(size), self.discard_s)
        except asyncio.TimeoutError:
            pass


class InFlight:
    """ASGI middleware: at most ``limit`` requests in flight; one more is answered at once with
    503, ``Retry-After`` and a JSON error (uvicorn's own ``limit_concurrency`` answers a plain
    503 without Retry-After, and counts idle connections too). The probes and /metrics are
    always answered: a busy server is alive and ready."""
    PROBES = frozenset({"/health", "/ready", "/metrics", "/translator/health"})

    def __init__(self, app, limit: int):
        self.app, self.limit, self.active = app, limit, 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") in self.PROBES:
            return await self.app(scope, receive, send)
        if self.active >= self.limit:
            busy = JSONResponse({"error": f"the server is busy: {self.active} requests in "
                                          f"flight, its limit (-max_connections)"},
                                status_code=503, headers={"Retry-After": "1"})
            return await busy(scope, receive, send)
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1


class Measure:
    """ASGI middleware: each request's route, status and seconds, into the metrics (plain ASGI:
    Starlette's ``BaseHTTPMiddleware`` took a sixth of the server process's time per request)."""

    def __init__(self, app, metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.monotonic(), [500]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
        await self.app(scope, receive, sending)
        route = getattr(scope.get("route"), "path", "other")  # set by the router, in place
        self.metrics.request(route, status[0], time.monotonic() - start)


def replay(messages, receive):
    """A receive that gives ``messages`` (the body, read already), then passes on to the
    connection's own ``receive``: its next message is the client's disconnect, when it comes."""
    pending = list(messages)

    async def replayed():
        if pending:
            return pending.pop(0)
        return await receive()
    return replayed


async def disconnected(receive) -> None:
    """Returns when the client has gone (``receive`` called after the body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass
