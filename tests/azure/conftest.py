"""Offline Azure: no test here may open a socket beyond loopback."""

from __future__ import annotations

from tests.clouds import loopback_only

__all__ = ["loopback_only"]
