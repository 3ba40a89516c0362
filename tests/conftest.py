"""Shared fixtures: the devices to test on (CUDA and MPS cases skip themselves where absent)."""

import pytest
import torch


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return mps is not None and mps.is_available()


DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
    pytest.param("mps", id="mps", marks=pytest.mark.skipif(not _mps_available(), reason="no Apple MPS device")),
]


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    """Every test that takes `device` runs on the CPU, and on CUDA and MPS where they exist."""
    return torch.device(request.param)


@pytest.fixture(scope="module")
def one_thread():
    """Run a module on one CPU thread. Modules of tiny models use it (``pytestmark``, so that their
    module-scoped fixtures run on one thread too): one thread is as
    fast for them, and robust on a CPU shared with other jobs, where OpenMP threads can spend ten
    times longer waiting for each other than computing."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
