"""``python -m tests.forkserver_echo CODE [SLEEP]``: says where and how it runs, then exits CODE (for
tests/test_forkserver.py)."""

import json
import os
import signal
import sys
import time

if len(sys.argv) > 2:
    time.sleep(float(sys.argv[2]))
print(
    json.dumps(
        {
            "argv": sys.argv[1:],
            "cwd": os.getcwd(),
            "marker": os.environ.get("FORKSERVER_MARKER"),
            "sigint_default": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
            "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
            "name": __name__,
        }
    )
)
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
