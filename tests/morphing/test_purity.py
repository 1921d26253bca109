"""The morphing core stays pure: importing all of it loads neither torch nor grpc."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_core_loads_no_heavy_framework() -> None:
    code = (
        "import sys\n"
        "import morphing, morphing.layout, morphing.profile, morphing.stages, morphing.simulator\n"
        "import morphing.planner, morphing.policy, morphing.transfer\n"
        "heavy = [m for m in ('torch', 'grpc', 'numpy', 'sqlalchemy') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
