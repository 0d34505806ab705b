"""Option types validate on construction, with messages that name the problem."""

from __future__ import annotations

import pytest

from fray import ActorOptions, JobStatus, Lifetime, Resource, RuntimeEnv, TaskOptions
from fray.types import normalize_resources


def test_runtime_env_validation() -> None:
    RuntimeEnv(package_requirements=["numpy>=1"], env={"A": "1"})
    with pytest.raises(TypeError, match="list of strings"):
        RuntimeEnv(package_requirements="numpy")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        RuntimeEnv(package_requirements=["  "])
    with pytest.raises(TypeError, match="str to str"):
        RuntimeEnv(env={"A": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="not valid"):
        RuntimeEnv(env={"A=B": "1"})
    with pytest.raises(ValueError, match="greater than maximum"):
        RuntimeEnv(minimum_resources=[Resource("CPU", 4)], maximum_resources=[Resource("CPU", 2)])
    with pytest.raises(ValueError, match=">= 0"):
        Resource("CPU", -1)
    with pytest.raises(TypeError):
        RuntimeEnv(minimum_resources=[("CPU", 1)])  # type: ignore[list-item]


def test_task_and_actor_options_validation() -> None:
    assert TaskOptions().max_retries == 3
    with pytest.raises(TypeError, match="retry_exceptions"):
        TaskOptions(retry_exceptions=["ValueError"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="max_calls"):
        TaskOptions(max_calls=0)
    with pytest.raises(TypeError, match="runtime_env"):
        TaskOptions(runtime_env={"env": {}})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs a name"):
        ActorOptions(lifetime=Lifetime.DETACHED)
    with pytest.raises(TypeError, match="Lifetime"):
        ActorOptions(name="x", lifetime="detached")  # type: ignore[arg-type]
    assert TaskOptions(retry_exceptions=[KeyError]).should_retry(KeyError("k"))
    assert not TaskOptions(retry_exceptions=[KeyError]).should_retry(ValueError())


def test_normalize_resources() -> None:
    assert normalize_resources({"CPU": 1, "GPU": 0}) == {"CPU": 1.0}
    with pytest.raises(TypeError, match="number"):
        normalize_resources({"CPU": "1"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="dict"):
        normalize_resources([("CPU", 1)])  # type: ignore[arg-type]


def test_job_status_terminal() -> None:
    assert {s for s in JobStatus if s.is_terminal} == {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}


def test_job_status_is_a_str_as_in_the_earlier_fray() -> None:
    status = JobStatus.SUCCEEDED
    assert status == "SUCCEEDED" and "SUCCEEDED" in status and status != "FAILED"
    assert str(status) == f"{status}" == "SUCCEEDED"
    assert JobStatus("FAILED") is JobStatus.FAILED


def test_runtime_env_messages_keep_the_earlier_wording() -> None:
    with pytest.raises(ValueError, match=r"minimum_resources .* exceeds maximum_resources"):
        RuntimeEnv(minimum_resources=[Resource("CPU", 4)], maximum_resources=[Resource("CPU", 2)])
    with pytest.raises(ValueError, match="cannot be negative"):
        Resource("CPU", -1)
    with pytest.raises(ValueError, match="cannot contain empty strings"):
        RuntimeEnv(package_requirements=[""])
    with pytest.raises(TypeError, match="env keys must be strings"):
        RuntimeEnv(env={1: "a"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="env values must be strings"):
        RuntimeEnv(env={"A": 1})  # type: ignore[dict-item]
