"""Every kind of event the controller's log holds (:mod:`controller.eventlog.kinds`, where the client reads it too)."""

from __future__ import annotations

from controller.eventlog.kinds import EventKind

__all__ = ["EventKind"]
