"""The live dashboard's admin actions: a row of buttons (shown only when the owner says
``admin=True``), the confirmation right under it, and the outcome message.

Nothing is sent before the confirmation's "Yes, <action>" button; "No, keep" sends nothing.
The outcome ("done: Resubmit dead job ... → new id", or the error) stays in the message line,
which refreshes never touch: the next action replaces it and it clears itself after
:data:`MESSAGE_S`. DOM classes: ``istos-admin`` (the button row), ``istos-admin-<action>``,
``istos-confirm`` (the confirmation row) with ``istos-confirm-text``, ``istos-confirm-yes`` and
``istos-confirm-no``, ``istos-message`` (the outcome line), ``istos-admin-reason`` (the
optional reason the Pause button sends, a text field beside it).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from html import escape as esc
from typing import Any

import ipywidgets as W

from istos.errors import ConfigError

__all__ = ["ACTIONS", "MESSAGE_S", "RENAMED_ACTIONS", "AdminPanel"]

MESSAGE_S = 120.0  # an outcome stays this long unless the next action replaces it

# action -> (button label, whether it needs a job id)
ACTIONS: dict[str, tuple[str, bool]] = {
    "pause": ("Pause queue", False), "resume": ("Resume queue", False),
    "resubmit": ("Resubmit dead job", True), "purge": ("Purge dead job", True),
    "purge-all": ("Purge all dead", False), "cancel-job": ("Cancel job", True),
    "redrive-all": ("Redrive all dead", False), "promote": ("Promote delayed", False),
    "purge-old": ("Purge dead > 1 h", False)}
RENAMED_ACTIONS = {"requeue": "resubmit", "requeue-all": "redrive-all"}
"""Old action names :meth:`AdminPanel.ask` still takes for one release (with a warning)."""


@dataclass(frozen=True)
class Pending:
    """An action awaiting its confirmation."""

    action: str
    question: str
    verb: str  # the Yes button says "Yes, <verb>"
    run: Callable[[], Any]


def _pending(lq: Any, action: str, job: str, reason: str = "") -> Pending:
    pause_question = "Pause claiming on this queue" + (f" (reason: {reason})?" if reason
                                                       else "?")
    table: dict[str, tuple[str, str, Callable[[], Any]]] = {
        "pause": (pause_question, "pause", (lambda: lq.pause(reason)) if reason else lq.pause),
        "resume": ("Resume claiming on this queue?", "resume", lq.resume),
        "resubmit": (f"Resubmit dead job {job}'s body as a new job (a new id)?", "resubmit",
                     lambda: lq.resubmit(job)),
        "purge": (f"Delete dead job {job} for good?", "delete", lambda: lq.purge_dead([job])),
        "purge-all": ("Delete ALL dead letters for good?", "delete all",
                      lambda: lq.purge_dead()),
        "cancel-job": (f"Cancel job {job}? (a running job is stopped by its worker)",
                       "cancel the job", lambda: lq.cancel(job)),
        "redrive-all": ("Redrive EVERY dead letter back to ready (under its own id, afresh)?",
                        "redrive all", lambda: lq.redrive_dead()),
        "promote": ("Make every delayed job ready now?", "promote", lambda: lq.promote()),
        "purge-old": ("Delete every dead letter older than 1 h for good?", "delete them",
                      lambda: lq.purge_dead(older_than_s=3600.0)),
    }
    question, verb, run = table[action]
    return Pending(action, question, verb, run)


class AdminPanel:
    """Admin buttons, their confirmation and the outcome message of the last one.

    ``job_id()`` names the job the job-level actions act on when :meth:`ask` is given none (the
    job tab's box); ``after()`` runs after a confirmed action (the dashboard refreshes)."""

    def __init__(self, live_queue: Any, job_id: Callable[[], str],
                 after: Callable[[], None]) -> None:
        self.live_queue, self._job_id, self._after = live_queue, job_id, after
        self.admin = False
        self.pending: Pending | None = None
        self._message_at: float | None = None
        self.buttons = {name: W.Button(description=label, layout=W.Layout(width="auto"))
                        for name, (label, _job) in ACTIONS.items()}
        # Beside Pause: what it sends as the stored pause's reason (empty: none).
        self.reason = W.Text(placeholder="pause reason (optional)",
                             layout=W.Layout(width="14em"))
        row = [w for name, b in self.buttons.items()
               for w in ((b, self.reason) if name == "pause" else (b,))]
        self.row = W.HBox(row, layout=W.Layout(display="none", flex_flow="row wrap"))
        self.text = W.HTML()
        self.yes = W.Button(description="Yes", button_style="danger",
                            layout=W.Layout(width="auto"))
        self.no = W.Button(description="No, keep", layout=W.Layout(width="auto"))
        # A framed row of its own, under the buttons it answers, saying what it asks.
        self.confirm_box = W.HBox([W.HTML("<b>Confirm:</b>&nbsp;"), self.text, self.yes,
                                   self.no], layout=W.Layout(
            display="none", border="2px solid #e45756", padding="2px 6px",
            align_items="center", margin="2px 0"))
        self.message = W.HTML()
        for widget, cls in ((self.row, "istos-admin"), (self.confirm_box, "istos-confirm"),
                            (self.text, "istos-confirm-text"), (self.yes, "istos-confirm-yes"),
                            (self.no, "istos-confirm-no"), (self.message, "istos-message"),
                            (self.reason, "istos-admin-reason")):
            widget.add_class(cls)
        for name, button in self.buttons.items():
            button.add_class(f"istos-admin-{name}")
            button.on_click(lambda _b, name=name: self._quietly(lambda: self.ask(name)))
        self.yes.on_click(lambda _b: self._quietly(self.confirm))
        self.no.on_click(lambda _b: self.cancel())
        self.widget = W.VBox([self.row, self.confirm_box, self.message])

    def set_admin(self, admin: bool) -> None:
        """The owner said whether this queue is admin: show or hide the buttons."""
        self.admin = bool(admin)
        self.row.layout.display = None if self.admin else "none"

    def ask(self, action: str, job_id: str | None = None) -> None:
        """Show the confirmation for ``action`` (see :data:`ACTIONS`) on ``job_id`` (default:
        the job tab's); nothing is sent before :meth:`confirm`. ``pause`` sends the reason
        field's text, as it is now, when it holds any. Raises PermissionError unless
        the owner said admin, ConfigError (a ValueError) for an unknown action."""
        if not self.admin:
            raise PermissionError("this queue was not declared with admin=True")
        if action in RENAMED_ACTIONS:
            warnings.warn(f"admin action {action!r} is deprecated and goes in the next "
                          f"release: use {RENAMED_ACTIONS[action]!r}", DeprecationWarning,
                          stacklevel=2)
            action = RENAMED_ACTIONS[action]
        if action not in ACTIONS:
            raise ConfigError(f"unknown admin action {action!r} (one of {', '.join(ACTIONS)})")
        job = (self._job_id() if job_id is None else str(job_id)).strip()
        if ACTIONS[action][1] and not job:
            what = "job" if action == "cancel-job" else "dead job"
            self.say(f"pick a {what} in the job tab (or a row's button) first")
            return
        self.pending = _pending(self.live_queue, action, job, str(self.reason.value).strip())
        self.text.value = esc(self.pending.question)
        self.yes.description = f"Yes, {self.pending.verb}"
        self.confirm_box.layout.display = None
        self.say("")  # the outcome shown belonged to the action before

    def confirm(self) -> Any:
        """Run the action awaiting confirmation; returns its result (then ``after()``). The
        outcome, or the error (raised again), stays in the message line."""
        pending, self.pending = self.pending, None
        self.confirm_box.layout.display = "none"
        if pending is None:
            return None
        try:
            result = pending.run()
        except Exception as exc:
            self.say(f"failed: {pending.question.rstrip('?')}: {type(exc).__name__}: {exc}")
            raise
        self.say(f"done: {pending.question.rstrip('?')}"
                 + ("" if result is None else f" → {result}"))
        self._after()
        return result

    def cancel(self) -> None:
        """Drop the action awaiting confirmation (nothing was sent)."""
        pending, self.pending = self.pending, None
        self.confirm_box.layout.display = "none"
        if pending is not None:
            self.say(f"kept: nothing sent ({pending.question.rstrip('?')})")

    def say(self, text: str) -> None:
        """Show ``text`` (with the time) in the message line until the next action or
        :data:`MESSAGE_S`; "" clears it."""
        self._message_at = time.monotonic() if text else None
        self.message.value = "" if not text else (
            f"<b>{esc(time.strftime('%H:%M:%S'))}</b> {esc(text)}")

    def expire(self) -> None:
        """Clear a message older than :data:`MESSAGE_S` (the dashboard calls this each
        refresh; nothing else a refresh does touches the line)."""
        if self._message_at is not None and time.monotonic() - self._message_at > MESSAGE_S:
            self.say("")

    def _quietly(self, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - shown in the message line
            if "failed: " not in self.message.value:  # confirm() said it already
                self.say(f"error: {type(exc).__name__}: {exc}")
