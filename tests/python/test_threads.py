"""The GIL is released around reads and decodes: two Python threads restoring at once overlap.

Each restore reads through its own bandwidth limit (a token bucket that sleeps), so the figure
does not depend on free CPU cores: serial restores take the sum of the two, overlapping ones
about the longer. The bound leaves room for a loaded machine."""
import threading
import time

import numpy as np

import tqkv
from conftest import session_arrays


def test_two_threads_restoring_overlap(tmp_path, throttle_uri):
    uri = str(tmp_path / "kv")
    k, v = session_arrays(layers=4, tokens=512, heads=2, dim=128, dtype=np.float16)
    for key in ("a", "b"):
        tqkv.checkpoint(uri, key, k, v, codec="fp16")
    size = tqkv.open_store(uri).size("a")
    rate = size / 0.6  # 0.6 s per restore at the limit
    slow = tqkv.open_store(throttle_uri(uri, read_rate=rate, per_object=True))

    def one(key):
        t = time.perf_counter()
        tqkv.restore(slow, key)
        return time.perf_counter() - t

    serial = one("a") + one("b")
    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(key,)) for key in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    parallel = time.perf_counter() - t0
    assert serial > 1.0  # the limit held
    assert parallel < 0.8 * serial, (parallel, serial)
