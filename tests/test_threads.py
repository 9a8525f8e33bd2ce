"""``codechat`` on a busy machine lets PyTorch's OpenMP threads sleep at once (:mod:`codechat.config.threads`),
decided before PyTorch loads; a setting of the user's is kept."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, os, sys
from codechat.config.threads import calm_threads_when_busy
did = calm_threads_when_busy(load=float(sys.argv[1]), cores=2)
import torch  # after the decision, as in the codechat command
print(json.dumps({"did": did, "spin": os.environ.get("GOMP_SPINCOUNT")}))
"""


@pytest.mark.parametrize("load,user,want", [(2.0, None, {"did": True, "spin": "0"}),
                                            (0.9, None, {"did": False, "spin": None}),
                                            (2.0, "5000", {"did": False, "spin": "5000"})])
def test_threads_sleep_at_once_only_on_a_busy_machine_and_never_over_the_users_setting(load, user, want):
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.update({"GOMP_SPINCOUNT": user} if user else {})
    p = subprocess.run([sys.executable, "-c", PROBE, str(load)], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == want


def test_too_late_once_torch_is_loaded(monkeypatch):
    from codechat.config.threads import calm_threads_when_busy
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    import torch  # noqa: F401 (loaded: OpenMP has read its settings)
    assert calm_threads_when_busy(load=8.0, cores=2) is False and "GOMP_SPINCOUNT" not in os.environ
