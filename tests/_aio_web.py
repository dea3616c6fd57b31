"""An aiohttp application on ``p2p.aio``, run as a real process by tests/test_aio.py.

``python tests/_aio_web.py NODE_DIR HTTP_PORT [--seed H:P]``

The node opens in the application's cleanup context (``web.run_app`` closes
it on Ctrl-C or SIGTERM, after the server stops).  Routes: ``POST /publish``
publishes the body on ``chat`` and answers once every subscriber has it;
``GET /got`` lists the payloads delivered from other nodes; ``GET /members``
counts members.  Prints ``{"port"}`` when the node listens and, after
``run_app`` returns, ``{"end"}`` with the threads and sockets left.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable

from _aio_app import end_report, say
from aiohttp import web

from p2p import Delivery, NodeConfig, P2PError, aio

NODE = web.AppKey("node", aio.AioNode)
GOT = web.AppKey("got", list[str])


async def collect(sub: aio.Subscription, got: list[str]) -> None:
    d: Delivery
    async for d in sub:
        if not d.own:
            got.append(d.payload.decode())


def node_context(
    args: argparse.Namespace,
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def context(app: web.Application) -> AsyncIterator[None]:
        cfg = NodeConfig(discovery=False, seeds=tuple(args.seed), detector_interval=0.5)
        async with aio.open_node(args.node_dir, cfg, queue_size=32) as node:
            app[NODE] = node
            say(port=node.port, id=f"{node.id:016x}")
            sub = await node.subscribe("chat")
            task = asyncio.create_task(collect(sub, app[GOT]))
            yield
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return context


async def publish(request: web.Request) -> web.Response:
    body = await request.read()
    try:
        msg = await request.app[NODE].publish("chat", body, wait_acked=True)
    except P2PError as exc:
        return web.json_response({"error": str(exc)}, status=409)
    return web.json_response({"seq": msg.seq})


async def got(request: web.Request) -> web.Response:
    return web.json_response(request.app[GOT])


async def members(request: web.Request) -> web.Response:
    return web.json_response(len(await request.app[NODE].members()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("node_dir")
    parser.add_argument("http_port", type=int)
    parser.add_argument("--seed", action="append", default=[])
    options = parser.parse_args()
    app = web.Application()
    app[GOT] = []
    app.cleanup_ctx.append(node_context(options))
    app.add_routes(
        [web.post("/publish", publish), web.get("/got", got), web.get("/members", members)]
    )
    try:
        web.run_app(app, host="127.0.0.1", port=options.http_port, print=None)
    except P2PError as exc:
        print(f"aio_web: error: {exc}", file=sys.stderr)
        sys.exit(end_report(2))
    sys.exit(end_report(0))
