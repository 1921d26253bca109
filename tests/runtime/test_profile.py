"""``spotmorph profile`` writes a profile the planner's parser accepts."""

from __future__ import annotations

from pathlib import Path

from morphing.profile import parse_profile
from spotmorph.cli import main
from tests.runtime.helpers import TINY


def test_profile_command_writes_the_planner_format(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    code = main(["profile", TINY, "--micro-batch-sizes=1,2", "--repeats=2", "--no-network", f"--out={out}"])
    assert code == 0
    profile = parse_profile(out.read_text())
    assert [layer.name for layer in profile.layers] == ["embed", "block0", "block1", "head"]
    assert profile.micro_batch_sizes == (1, 2)
    assert profile.optimizer_bytes_per_parameter_byte == 2.0
    embed, head = profile.layers[0], profile.layers[-1]
    assert embed.output_activation_bytes_per_sample == 8 * 16 * 4
    assert head.output_activation_bytes_per_sample == 0
    assert all(layer.activation_memory_bytes_per_sample > 0 for layer in profile.layers)


def test_profile_rejects_bad_sizes(tmp_path: Path) -> None:
    assert main(["profile", TINY, "--micro-batch-sizes=0,x", f"--out={tmp_path / 'p.json'}"]) == 2
