"""`meshdit serve --ray`'s flags are checked before anything starts, with the fix in the message."""
from __future__ import annotations

import pytest

from meshdit.cli import build_parser
from meshdit.errors import ConfigError
from meshdit.serve.command import ray_options


def options(*flags):
    return ray_options(build_parser().parse_args(["serve", *flags]))


@pytest.mark.parametrize("flags, message", [
    (["--replicas", "2"], "--replicas is a setting of --ray"),
    (["--ray-autoscaling", "{}"], "--ray-autoscaling is a setting of --ray"),
    (["--ray", "--replicas", "0"], "--replicas must be >= 1"),
    (["--ray", "--ray-gpus-per-rank", "-1"], "--ray-gpus-per-rank must be between 0 and 8"),
    (["--ray", "--ray-cpus-per-rank", "0"], "--ray-cpus-per-rank must be > 0"),
    (["--ray", "--ray-autoscaling", "{min_replicas: 1}"], "--ray-autoscaling is not JSON"),
    (["--ray", "--ray-autoscaling", "[1, 2]"], "must be a JSON object"),
])
def test_bad_ray_flags_are_refused(flags, message):
    with pytest.raises(ConfigError, match=message):
        options(*flags)


def test_without_ray_nothing_is_asked_of_ray():
    assert options() is None


def test_ray_settings_reach_the_deployment():
    pytest.importorskip("ray.serve")
    got = options("--ray", "--replicas", "3", "--ray-cpus-per-rank", "0.5",
                  "--ray-autoscaling", '{"min_replicas": 1, "max_replicas": 4}')
    assert got == {"replicas": 3, "autoscaling": {"min_replicas": 1, "max_replicas": 4}, "address": None,
                   "gpus_per_rank": None, "cpus_per_rank": 0.5}
