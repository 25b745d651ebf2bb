"""Bad input never loses memory or lets a limit through (issue: nothing lost, nothing bypassed)."""
from __future__ import annotations

import numpy as np
import pytest

from mrkit import (
    DEFAULT_STREAM, CudaMemoryResource, HostMemoryResource, LimitingAdaptor, OutOfMemoryError,
    PoolResource, StatisticsAdaptor, VirtualMemoryResource,
)


def test_limiting_enforces_its_limit_for_numpy_sizes(sim):
    lim = LimitingAdaptor(CudaMemoryResource(), 4096)
    with pytest.raises(OutOfMemoryError, match="limit"):
        lim.allocate(np.int64(8192), DEFAULT_STREAM)
    p = lim.allocate(np.int64(4096), DEFAULT_STREAM)
    assert lim.used_bytes == 4096
    with pytest.raises(OutOfMemoryError):
        lim.allocate(np.int32(1), DEFAULT_STREAM)
    lim.deallocate(p, np.int64(4096), DEFAULT_STREAM)
    assert lim.used_bytes == 0 and type(lim.used_bytes) is int


@pytest.mark.parametrize("dtype", [np.uint64, np.uint32, np.int64])
@pytest.mark.parametrize("over_pool", [False, True])
def test_statistics_count_unsigned_numpy_sizes_exactly(sim, dtype, over_pool):
    up = CudaMemoryResource()
    stats = StatisticsAdaptor(PoolResource(up) if over_pool else up)
    p = stats.allocate(dtype(1000), DEFAULT_STREAM)
    stats.deallocate(p, dtype(1000), DEFAULT_STREAM)
    s = stats.statistics
    assert (s.current_count, s.total_count, s.current_bytes, s.total_bytes, s.peak_bytes) == (0, 1, 0, 1000, 1000)


@pytest.mark.parametrize("make", [lambda: PoolResource(CudaMemoryResource()), lambda: VirtualMemoryResource(0)])
@pytest.mark.parametrize("bad,exc", [(1000.0, TypeError), ("1000", TypeError), (True, TypeError), (-1000, ValueError)])
def test_a_bad_free_leaves_the_block_freeable(sim, make, bad, exc):
    mr = make()
    p = mr.allocate(1000, DEFAULT_STREAM)
    with pytest.raises(exc, match="nbytes"):
        mr.deallocate(p, bad, DEFAULT_STREAM)
    assert mr.live_bytes == 1000  # unchanged
    mr.deallocate(p, np.uint64(1000), DEFAULT_STREAM)  # the right free (numpy size) still works
    assert mr.live_bytes == 0
    with pytest.raises(ValueError, match="already freed"):
        mr.deallocate(p, 1000, DEFAULT_STREAM)


def test_host_allocation_beyond_addressable_is_out_of_memory():
    mr = HostMemoryResource()
    with pytest.raises(OutOfMemoryError, match=str(2**64)):
        mr.allocate(2**64, DEFAULT_STREAM)


def test_a_log_survives_interpreter_exit_without_close(tmp_path):
    import subprocess
    import sys
    log = tmp_path / "events.csv"
    code = (
        "import mrkit\n"
        "mrkit.set_backend('sim')\n"
        f"mr = mrkit.LoggingAdaptor(mrkit.HostMemoryResource(), {str(log)!r})\n"
        "for _ in range(100):\n"
        "    p = mr.allocate(256, mrkit.DEFAULT_STREAM)\n"
        "    mr.deallocate(p, 256, mrkit.DEFAULT_STREAM)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    from mrkit import read_log
    assert len(read_log(str(log))) == 200


def test_a_failed_free_is_not_logged_and_a_free_is_logged_before_reuse(sim):
    import io
    from mrkit import LoggingAdaptor, read_log
    sink = io.StringIO()
    mr = LoggingAdaptor(PoolResource(CudaMemoryResource()), sink)
    p = mr.allocate(512, DEFAULT_STREAM)
    with pytest.raises(ValueError):
        mr.deallocate(p, 1024, DEFAULT_STREAM)  # wrong size: refused, not logged
    mr.deallocate(p, 512, DEFAULT_STREAM)
    mr.flush()
    sink.seek(0)
    assert [e.action for e in read_log(sink)] == ["allocate", "free"]


def test_read_log_of_a_binary_file_is_a_value_error(tmp_path):
    from mrkit import read_log
    f = tmp_path / "bin.csv"
    f.write_bytes(bytes(range(256)))
    with pytest.raises(ValueError, match="source .* not an allocation log"):
        read_log(str(f))
