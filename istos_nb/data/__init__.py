"""The notebook side's bottom layer: pure data.

Frames of a JobEvent stream (:mod:`~istos_nb.data.frames`), queue series
(:mod:`~istos_nb.data.series`) and the replayable :class:`~istos_nb.data.trace.Trace` with the
crashes it infers (:mod:`~istos_nb.data.trace_crashes`; its file format is
:mod:`istos.tracefile`). Nothing here imports a widget, a plotting library or live code
(``istos_nb.live``, ``istos_nb.sim``, ``istos_nb.views`` all sit above it); the
``layers`` contract in ``pyproject.toml`` holds that.
"""
