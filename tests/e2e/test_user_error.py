"""A job whose own input is wrong fails at once on a real cluster: no restart, the trainer's message as its reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from spotmorph.local.harness import TINY_GPT_SPEC, LocalCluster

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
NO_EVAL = "eval_interval=5 but the model's spec has no eval_dataset; set 0"


def test_a_trainer_that_refuses_the_jobs_input_fails_the_job_at_once(cluster: LocalCluster, tmp_path: Path) -> None:
    """examples/tiny_gpt.py:build has no eval dataset, so every trainer exits 2 at start-up (a user error)."""
    cluster.up(nodes=2, slots=1)
    for vm in cluster.vms():  # CPU slots, also on a host with GPUs (one GPU per rank, one host for every VM)
        assert "--gpus none" in " ".join(vm.command()), vm.command()
    other_model = f"profile={REPO / 'examples' / 'profiles' / 'hf_gpt2.json'}"  # the demo's spec, GPT-2's profile
    refused = cluster.cli("submit", str(TINY_GPT_SPEC), "--set", other_model, check=False)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "INVALID_ARGUMENT: profile: " in refused.stderr and "was not measured for this model" in refused.stderr
    assert "layer 1 is 'layer0' in the profile, 'block0' in the model" in refused.stderr, refused.stderr
    job = cluster.submit_checked(steps=10, eval_interval=5, checkpoint_dir=tmp_path / "ckpt")  # its own profile
    final = cluster.wait_state(job, {"SUCCEEDED", "FAILED", "CANCELLED"}, 120)
    assert final["state"] == "FAILED" and final["failure_cause"] == "user_error", final
    assert final["reason"].startswith(NO_EVAL + " (rank "), final["reason"]
    assert final["restarts"] == 0 and final["generation"] == 1, final
    shown = cluster.cli("status", job).stdout
    assert f"user_error: {NO_EVAL}" in shown, shown
    assert "TrainerStartFailed" not in cluster.event_log(), "no node is blamed for the job's own mistake"


SCALED_LOSS = Path(__file__).parent / "scaled_loss.py"


# make soak; make test: a user's error failing the job at once, above; the eval-loss check in tests/runtime
@pytest.mark.soak
def test_an_absurd_eval_loss_fails_the_job_as_the_users_error_and_no_node_is_lost(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Before: the controller refused the heartbeat carrying the loss, the agent exited, its node went LOST and
    each fresh node that took the job died the same way; the job never failed."""
    cluster.up(nodes=2, slots=1)
    job = cluster.submit(
        entrypoint=f"{SCALED_LOSS}:build",
        steps=12,
        eval_interval=4,
        dtype="float64",
        checkpoint_interval=0,
        checkpoint_dir=tmp_path / "ckpt",
    )
    final = cluster.wait_state(job, {"SUCCEEDED", "FAILED", "CANCELLED"}, 180)
    assert final["state"] == "FAILED" and final["failure_cause"] == "user_error", final
    assert "eval_loss" in final["reason"] and "beyond +-1e+30" in final["reason"], final["reason"]
    assert final["restarts"] == 0, final
    assert {n["state"] for n in cluster.nodes()} <= {"READY", "ASSIGNED"}, cluster.nodes()
    assert all(vm.alive() for vm in cluster.vms()), "every agent outlives the job's mistake"
