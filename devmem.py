"""Maintainer probe: CUDA memory after each test's teardown (not part of the project)."""
import json, os, time
import pytest

_T0 = time.monotonic()
_F = None

def pytest_runtest_logreport(report):
    global _F
    if report.when != "teardown":
        return
    import torch
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return
    if _F is None:
        _F = open(os.path.join(os.environ.get("OUT", "/tmp"), "mem.jsonl"), "w")
    s = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    _F.write(json.dumps({"id": report.nodeid, "t": round(time.monotonic() - _T0, 1),
        "alloc": torch.cuda.memory_allocated() / 2**30, "reserved": torch.cuda.memory_reserved() / 2**30,
        "free": free / 2**30, "retries": s.get("num_alloc_retries"), "ooms": s.get("num_ooms"),
        "inactive_split": s.get("inactive_split_bytes.all.current", 0) / 2**30,
        "segments": s.get("segment.all.current")}) + "\n")
    _F.flush()
