"""Closed-loop HTTP clients in the background of an async test: each worker sends its next request when its
last one is answered, until the block ends. Tests wait on what the load has done (so many answers), never on
how long it ran: a busy machine answers fewer requests per second, never a different outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Self

import httpx

from tests.waits import SAFETY_S, until_async


class ClosedLoop:
    """``workers`` clients calling :meth:`one` (worker index, request number) in turn; subclasses record."""

    def __init__(self, url: str, workers: int) -> None:
        self.url, self.workers = url, workers
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def one(self, client: httpx.AsyncClient, worker: int, n: int) -> None:
        raise NotImplementedError

    async def _worker(self, client: httpx.AsyncClient, worker: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            await self.one(client, worker, n)

    async def _run(self) -> None:
        async with httpx.AsyncClient(timeout=SAFETY_S) as client:
            await asyncio.gather(*(self._worker(client, i) for i in range(self.workers)))

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task

    async def reach(self, count: Callable[[], int], target: int, what: str) -> None:
        """Wait until ``count()`` reaches ``target`` while the load still runs."""

        async def done() -> bool:
            assert self._task is not None and not self._task.done(), "the load stopped"
            return count() >= target

        await until_async(done, what)
