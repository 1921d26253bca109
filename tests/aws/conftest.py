"""Offline AWS: moto's server, one a test worker, and no socket beyond loopback."""

from __future__ import annotations

from tests.aws.fake_aws import moto_server
from tests.clouds import loopback_only

__all__ = ["loopback_only", "moto_server"]
