"""Offline GCP: no test here may open a socket beyond loopback (the same guard as tests/azure)."""

from __future__ import annotations

from tests.azure.conftest import loopback_only

__all__ = ["loopback_only"]
