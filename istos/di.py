"""``Depends(...)``: dependency injection on worker parameters.

A parameter whose default is ``Depends(provider)`` receives the provider's value, resolved fresh
for each job (once per job even if several parameters use the same provider). Providers may be
plain or async functions, or (async) generators: the code after ``yield`` runs when the job ends,
whatever its outcome. Providers can themselves declare ``Depends`` parameters. A parameter named
``ctx`` that is not a ``Depends`` receives the job's :class:`~istos.context.JobContext`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any


class Depends:
    """A worker parameter's default that asks for a value per job, as in FastAPI:
    ``async def work(job, db=Depends(get_db))``.

    The provider is called once per job, and its value shared by every parameter of that job
    that asks for it. It may be a plain or async function, or a generator or async generator
    whose code after its ``yield`` runs as teardown once the job finished (ack or nack). Its
    own parameters may ask for other providers the same way. A provider that raises fails the
    attempt as the worker function raising would (a nack). Raises ``TypeError`` at once when
    ``provider`` is not callable.
    """

    __slots__ = ("provider",)

    def __init__(self, provider: Callable[..., Any]) -> None:
        if not callable(provider):
            raise TypeError(f"Depends() needs a callable, got {provider!r}")
        self.provider = provider

    def __repr__(self) -> str:
        return f"Depends({getattr(self.provider, '__name__', self.provider)!r})"


def plan(fn: Callable[..., Any]) -> tuple[list[tuple[str, Depends]], bool]:
    """Which parameters of ``fn`` are dependencies, and whether it takes ``ctx``."""
    deps: list[tuple[str, Depends]] = []
    wants_ctx = False
    for name, param in list(inspect.signature(fn).parameters.items())[1:]:
        if isinstance(param.default, Depends):
            deps.append((name, param.default))  # a Depends wins over the name "ctx"
        elif name == "ctx":
            wants_ctx = True
    return deps, wants_ctx


async def resolve(deps: list[tuple[str, Depends]], stack: AsyncExitStack,
                  cache: dict[Callable[..., Any], Any]) -> dict[str, Any]:
    return {name: await _value(dep.provider, stack, cache) for name, dep in deps}


async def _value(provider: Callable[..., Any], stack: AsyncExitStack,
                 cache: dict[Callable[..., Any], Any]) -> Any:
    if provider in cache:
        return cache[provider]
    kwargs = {name: await _value(p.default.provider, stack, cache)
              for name, p in inspect.signature(provider).parameters.items()
              if isinstance(p.default, Depends)}
    if inspect.isasyncgenfunction(provider):
        gen = provider(**kwargs)
        value = await gen.__anext__()
        stack.push_async_callback(_finish_async_gen, gen)
    elif inspect.isgeneratorfunction(provider):
        gen = provider(**kwargs)
        value = next(gen)
        stack.callback(_finish_gen, gen)
    else:
        value = provider(**kwargs)
        if inspect.isawaitable(value):
            value = await value
    cache[provider] = value
    return value


async def _finish_async_gen(gen: Any) -> None:
    try:
        await gen.__anext__()
    except StopAsyncIteration:
        pass


def _finish_gen(gen: Any) -> None:
    try:
        next(gen)
    except StopIteration:
        pass
