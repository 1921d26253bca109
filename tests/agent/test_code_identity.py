"""The code identity a warm trainer is held to: the job, its entrypoint's resolved file and content, its spec."""

from __future__ import annotations

from pathlib import Path

from morphing.jobspec import JobSpec
from worker_agent.contract.code_identity import code_identity


def job(entrypoint: str, seed: int = 0) -> JobSpec:
    return JobSpec(name="j", entrypoint=entrypoint, global_batch=4, seed=seed, steps=1, checkpoint_dir="/tmp/c")


def test_the_identity_follows_the_job_the_file_its_content_the_function_and_the_spec(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for folder in ("a", "b"):
        (tmp_path / folder / "model.py").write_text("def build(): pass\n")
    base = code_identity(job(f"{tmp_path}/a/model.py:build"), "job-1")
    assert code_identity(job(f"{tmp_path}/a/model.py:build"), "job-1") == base  # stable
    assert code_identity(job(f"{tmp_path}/a/../a/model.py:build"), "job-1") == base  # the path resolved
    assert code_identity(job(f"{tmp_path}/a/model.py:build"), "job-2") != base  # another job
    assert code_identity(job(f"{tmp_path}/b/model.py:build"), "job-1") != base  # same name, other folder
    assert code_identity(job(f"{tmp_path}/a/model.py:other"), "job-1") != base  # another function
    assert code_identity(job(f"{tmp_path}/a/model.py:build", seed=1), "job-1") != base  # another spec
    (tmp_path / "a" / "model.py").write_text("def build(): return 1\n")
    assert code_identity(job(f"{tmp_path}/a/model.py:build"), "job-1") != base  # the file changed


def test_a_missing_file_and_a_module_entrypoint_have_an_identity(tmp_path: Path) -> None:
    missing = code_identity(job(f"{tmp_path}/none.py:build"))
    assert missing == code_identity(job(f"{tmp_path}/none.py:build"))
    assert code_identity(job("examples.tiny_gpt:build")) != code_identity(job("examples.tiny_gpt:build_tiny"))
