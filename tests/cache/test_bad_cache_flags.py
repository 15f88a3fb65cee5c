"""Bad cache settings on the command line are refused before any rank starts (exit 2, a message naming the
flag, no rank started, nothing written, no heavy import), through tests/test_bad_input.py's checks. The bundled
model has 9 transformer blocks."""
import json
import os
import subprocess
import sys

import pytest

from tests import test_bad_input
from tests.test_bad_input import _REFUSE_ALL, workdir  # noqa: F401 - the fixture

BAD_CACHE_FLAGS = {
    "unknown-preset": (["--cache", "turbo"], "argument --cache: invalid choice: 'turbo'"),
    "threshold-negative": (["--cache", "fast", "--cache-threshold", "-0.1"],
                           "--cache-threshold must be a finite number >= 0, got -0.1"),
    "threshold-nan": (["--cache", "dbcache", "--cache-threshold", "nan"], "--cache-threshold must be a finite"),
    "front-and-back-cover-every-block": (["--cache", "dbcache", "--cache-fn", "5", "--cache-bn", "4"],
                                         "--cache-fn 5 + --cache-bn 4 leave none of this transformer's 9 blocks"),
    "front-and-back-above-blocks": (["--cache", "dbcache", "--cache-fn", "8", "--cache-bn", "3"],
                                    "--cache-fn 8 + --cache-bn 3 leave none of this transformer's 9 blocks"),
    "front-0": (["--cache", "dbcache", "--cache-fn", "0"], "--cache-fn must be a whole number >= 1"),
    "back-negative": (["--cache", "dbcache", "--cache-bn", "-1"], "--cache-bn must be a whole number >= 0"),
    "warmup-negative": (["--cache", "fast", "--cache-warmup", "-1"], "--cache-warmup must be a whole number >= 0"),
    "max-cached-0": (["--cache", "fast", "--cache-max-cached", "0"], "--cache-max-cached must be a whole number"),
    "compute-step-negative": (["--cache", "fast", "--cache-compute-steps", "-2"], "--cache-compute-steps takes"),
    "fast-with-front-blocks": (["--cache", "fast", "--cache-fn", "2"], "--cache-fn 2 does not apply to --cache fast"),
    "taylorseer-order-3": (["--cache", "fast", "--taylorseer", "3"], "argument --taylorseer: invalid choice"),
    "option-without-cache": (["--cache-threshold", "0.1"], "--cache-threshold set(s) an option of step caching"),
    "teacache": (["--use_teacache"], "--use-teacache: meshdit has no TeaCache"),
    "pipefusion-partial-warmup": (["--cache", "fast", "--pipefusion-parallel-degree", "2", "--warmup-steps", "1"],
                                  "--cache runs with PipeFusion only with full warmup"),
}


@pytest.mark.parametrize("flags,message", BAD_CACHE_FLAGS.values(), ids=BAD_CACHE_FLAGS.keys())
def test_bad_cache_flags_are_refused_before_ranks_start(flags, message, workdir, monkeypatch, capsys):  # noqa: F811
    test_bad_input.test_bad_input_is_refused_before_ranks_start(flags, message, workdir, monkeypatch, capsys)


def test_cache_refusals_come_before_the_heavy_imports(workdir):  # noqa: F811
    cases = [(name, ["generate", "--output", str(workdir / "out.png"), *flags], {}, message)
             for name, (flags, message) in BAD_CACHE_FLAGS.items()]
    proc = subprocess.run([sys.executable, "-c", _REFUSE_ALL, json.dumps(cases)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    assert {name: status for name, (status, _) in results.items() if status != 2} == {}  # else: stderr
    assert {name: heavy for name, (_, heavy) in results.items() if heavy} == {}
