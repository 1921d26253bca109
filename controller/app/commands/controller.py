"""``spotmorph controller``: the controller daemon (runs until SIGTERM, then exits 0)."""

from __future__ import annotations

import argparse
import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controller.app.providers import ProviderFactory


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="YAML file of settings (flags and environment win)")
    parser.add_argument("--state-dir", type=Path, help="where the SQLite state and tokens live")
    parser.add_argument("--listen", metavar="HOST:PORT", help="default 127.0.0.1:50051")
    parser.add_argument(
        "--database",
        metavar="URL",
        help="postgresql://USER@HOST:PORT/DB: state in PostgreSQL, shared by several controllers (one leads); "
        "default: SQLite in --state-dir",
    )
    parser.add_argument("--advertise", metavar="HOST:PORT", help="the address standbys name for this controller")
    parser.add_argument("--lease-seconds", type=float, help="the leader's lease with --database (default 6)")
    parser.add_argument("--token-file", type=Path, help="operator token (a random one is written when missing)")
    parser.add_argument("--tls-cert", type=Path, help="server certificate (PEM), see `spotmorph certs`")
    parser.add_argument("--tls-key", type=Path, help="server key (PEM)")
    parser.add_argument("--tls-ca", type=Path, help="CA that client certificates must be signed by (mutual TLS)")
    parser.add_argument("--allow-plaintext", action="store_true", default=None, help="no TLS beyond loopback")
    parser.add_argument("--heartbeat-expiry-seconds", type=float, help="a silent node is LOST after this")
    parser.add_argument("--debounce-seconds", type=float, help="wait this long after node arrivals")
    parser.add_argument(
        "--on-demand-gpu-hour-price",
        type=price,
        metavar="DOLLARS",
        help="an on-demand GPU's price per hour (default 3.0): turns a job's on_demand_max_dollars into GPUs",
    )
    parser.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at /metrics (and, on loopback or with TLS, the web dashboard at /)",
    )
    parser.add_argument(
        "--metrics-allow-remote", action="store_true", default=None, help="metrics beyond loopback without TLS"
    )
    parser.add_argument(
        "--tensorboard-dir",
        type=Path,
        help="write TensorBoard event files here, one folder per job (`tensorboard --logdir`)",
    )
    parser.add_argument(
        "--validate",
        dest="validate_invariants",
        action="store_true",
        default=None,
        help="check controller.core.invariants before every commit (a decision breaking one is not committed)",
    )
    parser.add_argument("--log-format", choices=("text", "json"), default="text", help="json: one object a line")


def price(text: str) -> float:
    """``--on-demand-gpu-hour-price``: dollars, finite and > 0 (argparse says a bad one and exits 2)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of dollars, e.g. 3.0") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text}: an on-demand GPU-hour must cost more than 0 dollars, e.g. 3.0")
    return value


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    """Structured logs: one JSON object a line, for journald or a log shipper."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": record.created,
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def run(args: argparse.Namespace, providers: Mapping[str, ProviderFactory] | None = None) -> int:
    """The daemon; ``providers`` adds provider factories the controller does not hold (``local``)."""
    import asyncio

    from controller.app.daemon import serve
    from controller.app.settings import load_settings

    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if args.log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    keys = ("state_dir", "listen", "token_file", "tls_cert", "tls_key", "tls_ca", "allow_plaintext")
    more = ("heartbeat_expiry_seconds", "debounce_seconds", "metrics_listen", "metrics_allow_remote", "tensorboard_dir")
    shared = ("database", "advertise", "lease_seconds")
    named = ("validate_invariants", "on_demand_gpu_hour_price")
    overrides = {k: getattr(args, k) for k in (*keys, *more, *shared, *named)}
    settings = load_settings(args.config, overrides)
    return asyncio.run(serve(settings, providers))
