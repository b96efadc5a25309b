"""Renamed public names: an old name keeps working for one release, and says so when used.

A renamed method keeps a thin method under its old name that calls :func:`renamed` and then
the new one, so ``warnings.simplefilter("error", DeprecationWarning)`` finds every caller left.
"""

from __future__ import annotations

import warnings


def renamed(old: str, new: str) -> None:
    """Warn that ``old`` is now called ``new``: a :class:`DeprecationWarning` attributed to the
    code that called the old name (the caller of the function that calls this). Never raises
    unless the warning filters turn the warning into an error."""
    warnings.warn(f"{old} is deprecated and goes in the next release: use {new} (the same "
                  "call, renamed)", DeprecationWarning, stacklevel=3)
