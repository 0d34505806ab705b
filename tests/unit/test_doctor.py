"""`fray doctor`: the real command's sections, the report's structure, and the pyverbs branches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from fray.backend import Backend
from fray.cli import doctor


def _fray_command() -> list[str]:
    script = Path(sys.executable).with_name("fray")  # the installed console script, next to this python
    return [str(script)] if script.exists() else [sys.executable, "-m", "fray.cli"]


def _monarch_installed() -> bool:
    try:
        from importlib.metadata import version

        version("fray-monarch")
        return True
    except Exception:
        return False


def _pyverbs_importable() -> bool:
    try:
        import pyverbs  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def doctor_run() -> subprocess.CompletedProcess[str]:
    """One run of the real `fray doctor` for the module's tests (it spawns a Monarch process when installed)."""
    return subprocess.run([*_fray_command(), "doctor"], capture_output=True, text=True, timeout=180)


def test_doctor_prints_every_section_and_exits_0(doctor_run: subprocess.CompletedProcess[str]) -> None:
    out = doctor_run.stdout
    assert doctor_run.returncode == 0, doctor_run.stderr
    for section in ("fray", "packages", "backends", "shared memory", "bandwidth"):
        assert f"\n{section}\n" in f"\n{out}", f"section {section!r} missing:\n{out}"
    for dist in doctor.DISTRIBUTIONS:
        assert f"  {dist}:" in out
    assert "in_memory: installed" in out
    for line in ("/dev/shm size:", "/dev/shm free:", "memory total:", "shm write:", "shm read:", "memcpy:"):
        assert line in out, out
    assert "GB/s" in out


def test_doctor_leaves_no_shm_file(doctor_run: subprocess.CompletedProcess[str]) -> None:
    if os.path.isdir("/dev/shm"):
        assert not [n for n in os.listdir("/dev/shm") if n.startswith("fray-doctor-")]


@pytest.mark.skipif(not _monarch_installed(), reason="fray-monarch is not installed (make test installs it)")
def test_doctor_monarch_section(doctor_run: subprocess.CompletedProcess[str]) -> None:
    out = doctor_run.stdout
    assert "\nmonarch backend\n" in out, out
    for line in ("socket guard:", "ibverbs available:", "rdma backend:", "rdma devices:", "rdma probe:"):
        assert line in out, out
    guard = next(line for line in out.splitlines() if "socket guard:" in line)  # pytest runs under the guard
    assert "active in this process" in guard or "fray run" in guard, guard
    probe = next(line for line in out.splitlines() if "rdma probe:" in line)
    assert "MB/s" in probe or "could not run:" in probe, probe
    assert "Monarch internal logs" not in out and "libcuda" not in out  # the probe's noise stays captured


@pytest.mark.skipif(not _monarch_installed(), reason="fray-monarch is not installed (make test installs it)")
@pytest.mark.skipif(_pyverbs_importable(), reason="pyverbs is installed here")
def test_doctor_without_pyverbs_lists_the_kernels_devices(doctor_run: subprocess.CompletedProcess[str]) -> None:
    """Without pyverbs the kernel's list; on a machine without RDMA, no advice to install anything (issue 28)."""
    line = next(line for line in doctor_run.stdout.splitlines() if "rdma devices:" in line)
    found = sorted(os.listdir("/sys/class/infiniband")) if os.path.isdir("/sys/class/infiniband") else []
    if found:
        assert line.split(":", 1)[1].strip().startswith(", ".join(found)) and "fray-monarch[rdma]" in line, line
    else:
        assert line.split(":", 1)[1].strip() == "no RDMA device", line


@pytest.mark.skipif(not _monarch_installed(), reason="fray-monarch is not installed (make test installs it)")
@pytest.mark.skipif(not _pyverbs_importable(), reason="pyverbs is not installed (optional: fray-monarch[rdma])")
def test_doctor_lists_rdma_devices_through_pyverbs(doctor_run: subprocess.CompletedProcess[str]) -> None:
    line = next(line for line in doctor_run.stdout.splitlines() if "rdma devices:" in line)
    assert "pyverbs not installed" not in line and "could not list" not in line, line


def test_json_output_parses() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "fray.cli", "doctor", "--json", "--no-probes"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    assert list(found)[:4] == ["fray", "packages", "backends", "shared memory"]
    assert "bandwidth" not in found


def test_report_structure() -> None:
    found = doctor.report(backends=["in_memory"])
    assert list(found)[:6] == ["fray", "packages", "backends", "shared memory", "gpus", "bandwidth"]
    assert list(found)[-1] == "verdict"
    for section, entries in found.items():
        assert isinstance(section, str) and isinstance(entries, dict) and entries
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in entries.items())
    assert list(found["packages"]) == list(doctor.DISTRIBUTIONS)
    assert found["packages"]["fray-core"] not in ("", "not installed")
    assert found["backends"]["in_memory"].startswith("installed")
    assert set(found["bandwidth"]) >= {"probe", "memcpy"}
    assert "in_memory backend" not in found  # the default diagnose() adds nothing
    text = doctor.format_report(found)
    assert text.startswith("fray\n  python:") and "\nbandwidth\n" in text


def test_report_without_probes_skips_bandwidth() -> None:
    assert "bandwidth" not in doctor.report(probes=False, backends=[])


def test_shm_probe_removes_its_files(tmp_path: Path) -> None:
    write, read = doctor.shm_bandwidth(1 << 20, rounds=2, directory=str(tmp_path))
    assert write > 0 and read > 0
    assert list(tmp_path.iterdir()) == []


class _Talkative(Backend):
    name = "talkative"

    def __init__(self, lines: Any = None, error: BaseException | None = None) -> None:
        self.lines, self.error = lines, error

    def job_context(self, **options: str) -> Any:
        raise NotImplementedError

    def cluster_context(self, **options: str) -> Any:
        raise NotImplementedError

    def diagnose(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.lines


def _with_backend(monkeypatch: pytest.MonkeyPatch, backend: Backend) -> doctor.Report:
    monkeypatch.setattr(doctor, "available_backends", lambda: {"talkative": "tests:_Talkative"})
    monkeypatch.setattr(doctor, "get_backend", lambda name: backend)
    return doctor.report(probes=False)


def test_a_backends_diagnose_lines_get_their_own_section(monkeypatch: pytest.MonkeyPatch) -> None:
    found = _with_backend(monkeypatch, _Talkative({"gpu count": 0, "link": "up"}))
    assert found["talkative backend"] == {"gpu count": "0", "link": "up"}


def test_a_failing_or_slow_diagnose_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    found = _with_backend(monkeypatch, _Talkative(error=RuntimeError("boom")))
    assert found["talkative backend"] == {"diagnose": "failed: RuntimeError: boom"}
    monkeypatch.setattr(doctor, "DIAGNOSE_TIMEOUT", 0.2)

    class Slow(_Talkative):
        def diagnose(self) -> Any:
            import time

            time.sleep(5)

    found = _with_backend(monkeypatch, Slow())
    assert found["talkative backend"]["diagnose"].startswith("failed: TimeoutError: timed out after 0.2 s")


# -- the Monarch backend's pyverbs branches, without needing pyverbs or an RDMA device --------------------------


@pytest.fixture
def diagnostics() -> Any:
    pytest.importorskip("fray_monarch", reason="fray-monarch is not installed (make test installs it)")
    from fray_monarch import diagnostics

    return diagnostics


def _fake_pyverbs(monkeypatch: pytest.MonkeyPatch, get_device_list: Any) -> None:
    class PyverbsRDMAError(Exception):
        pass

    device = types.ModuleType("pyverbs.device")
    device.get_device_list = lambda: get_device_list(PyverbsRDMAError)  # type: ignore[attr-defined]
    error = types.ModuleType("pyverbs.pyverbs_error")
    error.PyverbsRDMAError = PyverbsRDMAError  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pyverbs", types.ModuleType("pyverbs"))
    monkeypatch.setitem(sys.modules, "pyverbs.device", device)
    monkeypatch.setitem(sys.modules, "pyverbs.pyverbs_error", error)


def test_rdma_devices_without_pyverbs(diagnostics: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without pyverbs: the kernel's devices; installing pyverbs is suggested only where there are some."""
    monkeypatch.setitem(sys.modules, "pyverbs", None)  # import pyverbs -> ImportError
    monkeypatch.setitem(sys.modules, "pyverbs.device", None)
    monkeypatch.setattr(diagnostics, "SYSFS_RDMA", str(tmp_path / "missing"))
    assert diagnostics.rdma_devices() == "no RDMA device"
    monkeypatch.setattr(diagnostics, "SYSFS_RDMA", str(tmp_path))
    assert diagnostics.rdma_devices() == "no RDMA device"
    (tmp_path / "mlx5_1").mkdir()
    (tmp_path / "mlx5_0").mkdir()
    assert diagnostics.rdma_devices() == (
        "mlx5_0, mlx5_1 (pyverbs, optional, would list them through ibverbs: pip install 'fray-monarch[rdma]')"
    )


def test_rdma_devices_when_pyverbs_raises_for_no_device(diagnostics: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def raises(error: type[Exception]) -> Any:
        raise error("Failed to get devices list")

    _fake_pyverbs(monkeypatch, raises)
    assert diagnostics.rdma_devices() == "no RDMA device"


def test_rdma_devices_lists_names(diagnostics: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_pyverbs(
        monkeypatch, lambda error: [types.SimpleNamespace(name=b"mlx5_0"), types.SimpleNamespace(name="rxe0")]
    )
    assert diagnostics.rdma_devices() == "mlx5_0, rxe0"


def test_rdma_probe_that_times_out_says_so(diagnostics: Any) -> None:
    line = diagnostics.rdma_probe(1 << 20, timeout=0.05)
    assert line.startswith("could not run: timed out after 0.05 s"), line


def test_doctor_ends_with_a_verdict_and_has_a_ray_section(doctor_run: subprocess.CompletedProcess[str]) -> None:
    """issue 28: doctor gave no verdict and had no ray section."""
    out = doctor_run.stdout
    assert "\ngpus\n" in out and "\nverdict\n" in out, out
    assert out.rstrip().splitlines()[-1].strip().startswith("summary:"), out
    assert "in_memory: ready" in out.split("\nverdict\n", 1)[1], out
    try:
        import fray_ray  # noqa: F401
    except ImportError:
        return
    assert "\nray backend\n" in out and "RAY_ADDRESS:" in out and "recorded cluster:" in out, out


def test_the_verdict_says_what_stops_a_backend_and_what_to_do() -> None:
    found = {
        "backends": {
            "in_memory": "installed (fray.in_memory:InMemoryBackend)",
            "ray": "not installed: pip install -e backends/ray",
            "monarch": "installed (fray_monarch:MonarchBackend)",
        },
        "monarch backend": {"rdma probe": "ok", "diagnose": "failed: TimeoutError: timed out after 60 s"},
    }
    said = doctor.verdict(found)
    assert said["in_memory"] == "ready"
    assert said["ray"] == "not installed: pip install -e backends/ray"
    assert said["monarch"] == "installed, but diagnose: failed: TimeoutError: timed out after 60 s"
    assert said["summary"].startswith("ready for in_memory;") and "1 thing(s) to fix" in said["summary"]
