"""The package's HIP path through ROCm 6.4.3's real ``libamdhip64.so.6``
(Debian's, extracted by scripts/install-toolchains.sh into .toolchains/rocm)
on a machine without an AMD GPU: ``init`` on a "cuda" device of a ROCm torch
reports in one sentence that there is no AMD GPU and names the runtime file.

That library needs glibc 2.38; the build machines have 2.36. So the check
runs in a child Python started through .toolchains/rocm/bin/sid-run (Debian
sid's loader and libraries first on the search path). The torch installed
here is not a ROCm build: the child marks it as one (``torch.version.hip``)
and answers its raw-stream query, which is what makes the package take the
HIP path; everything after that is the package's and the real runtime's.
"""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SID_RUN = ROOT / ".toolchains" / "rocm" / "bin" / "sid-run"
RUNTIME = ROOT / ".toolchains" / "rocm" / "lib" / "libamdhip64.so.6"

CHILD = r"""
import torch
torch.version.hip = "6.4.43484"
torch._C._cuda_getCurrentRawStream = lambda index: 0
import dsv4_kvcache
try:
    dsv4_kvcache.init("cuda:0")
except Exception as e:
    print("RESULT " + type(e).__name__ + ": " + str(e))
else:
    print("RESULT opened a device")
"""


def test_hip_path_reports_no_amd_gpu_through_the_real_runtime():
    if not SID_RUN.exists():
        why = f"no ROCm runtime in {SID_RUN.parent.parent} (scripts/install-toolchains.sh extracts it)"
        if os.environ.get("DSV4_KVCACHE_REQUIRE_KERNELS") == "1":
            pytest.fail("DSV4_KVCACHE_REQUIRE_KERNELS=1 but " + why)
        pytest.skip(why)
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)
    env.pop("ROCM_PATH", None)
    r = subprocess.run(
        [str(SID_RUN), sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    results = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
    assert len(results) == 1, r.stdout + r.stderr
    msg = results[0][len("RESULT "):]
    print(msg)
    assert msg.startswith("RuntimeError: hip backend unavailable: "), msg
    assert "found no AMD GPU" in msg, msg
    assert str(RUNTIME.resolve()) in msg, msg
    assert ". " not in msg, "more than one sentence: " + msg
