"""Thin delegation: an :class:`~istos.Istos` method that is one of its components' methods.

``chain = delegate("workflows", Workflows.chain)`` in the class body makes ``app.chain`` the
bound ``app.workflows.chain``: one signature and one docstring (the component's), checked by
mypy at every call site, and no state on the app beyond the component itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")


class delegate(Generic[T, P, R]):
    """A method forwarded to the component held in attribute ``component`` of the instance."""

    def __init__(self, component: str, method: Callable[Concatenate[T, P], R]) -> None:
        self.component = component
        self.method = method
        self.__doc__ = method.__doc__
        self.__wrapped__ = method  # inspect.signature and help() show the component's

    def __set_name__(self, owner: type, name: str) -> None:
        self.__name__ = name

    @overload
    def __get__(self, obj: None, objtype: type | None = None
                ) -> Callable[Concatenate[T, P], R]: ...

    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> Callable[P, R]: ...

    def __get__(self, obj: object | None, objtype: type | None = None) -> Any:
        if obj is None:
            return self.method
        bound: Callable[P, R] = getattr(getattr(obj, self.component), self.method.__name__)
        return bound
