"""Shared by the algorithm tests: run torch single-threaded.

On a busy 2-core machine, OpenMP threads make tiny tensor ops take ~20 ms each instead of
microseconds; one thread keeps these tests fast and their reductions deterministic.
"""

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
