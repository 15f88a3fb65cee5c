"""The Kubernetes manifests in deploy/kubernetes/ parse, and start what docs/serving.md says: `meshdit serve` with
flags serve's own parser takes, a world the GPUs they ask for can hold, probes on /health and a Prometheus scrape of
/metrics on serve's --port, an API key from a Secret for the non-loopback --host, and an HPA on a metric serve exports."""
from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
import yaml

from meshdit.cli import build_parser
from meshdit.config import ParallelConfig
from meshdit.serve.metrics import Metrics

FOLDER = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def documents(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((FOLDER / name).read_text(encoding="utf-8")) if d]


def pod_templates(doc: dict) -> list[dict]:
    """(role, pod spec, pod metadata) of a Deployment or a LeaderWorkerSet."""
    if doc["kind"] == "Deployment":
        return [("pod", doc["spec"]["template"]["spec"], doc["spec"]["template"]["metadata"])]
    if doc["kind"] == "LeaderWorkerSet":
        t = doc["spec"]["leaderWorkerTemplate"]
        return [("leader", t["leaderTemplate"]["spec"], t["leaderTemplate"].get("metadata", {})),
                ("worker", t["workerTemplate"]["spec"], t["workerTemplate"].get("metadata", {}))]
    return []


def command_line(container: dict) -> list[str]:
    """The container's argv; `sh -c` lines are split as the shell would, with $(VAR) left as one word."""
    argv = [*container.get("command", []), *container.get("args", [])]
    if argv[:2] == ["sh", "-c"]:
        return shlex.split(re.sub(r"\$\((\w+)\)", r"\1", argv[2]))
    return argv


def serve_args(argv: list[str]):
    """(torchrun's options or {}, serve's parsed flags): serve's argv through meshdit's own parser."""
    torchrun = {}
    if argv[0] == "torchrun":
        start = argv.index("-m")
        assert argv[start + 1] == "meshdit", argv
        options = argv[1:start]
        torchrun = dict(zip(options[::2], options[1::2]))
        argv = argv[start + 2:]
    else:
        assert argv[0] == "meshdit", argv
        argv = argv[1:]
    assert argv[0] == "serve", argv
    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            raise AssertionError(f"meshdit serve refuses {argv}: {err.getvalue().strip()}") from None
    spelled = [a.split("=")[0] for a in argv if a.startswith("--")]
    abbreviated = [a for a in spelled if a not in serve._option_string_actions]
    assert not abbreviated, f"spell serve's flags out (an abbreviation breaks when a flag is added): {abbreviated}"
    return torchrun, args


def world_size(args) -> int:
    return ParallelConfig(
        ulysses_degree=args.ulysses_degree, ring_degree=args.ring_degree, cfg_degree=args.cfg_degree or 1,
        pipefusion_parallel_degree=args.pipefusion_parallel_degree,
        data_parallel_degree=args.data_parallel_degree,
        tensor_parallel_degree=args.tensor_parallel_degree).world_size


CASES = [(name, role, spec, meta) for name in ("serve.yaml", "serve-multinode.yaml")
         for doc in documents(name) for role, spec, meta in pod_templates(doc)]


def test_every_manifest_parses_and_names_a_known_kind():
    kinds = {d["kind"] for f in sorted(FOLDER.glob("*.yaml")) for d in documents(f.name)}
    assert kinds == {"Deployment", "Service", "LeaderWorkerSet", "HorizontalPodAutoscaler"}, kinds


@pytest.mark.parametrize("name, role, spec, meta", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_containers_run_meshdit_serve_with_flags_it_takes(name, role, spec, meta):
    (container,) = spec["containers"]
    torchrun, args = serve_args(command_line(container))
    gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
    if torchrun:  # one torchrun world over the replica's pods: the degrees fill nodes x GPUs per node
        assert int(torchrun["--nproc-per-node"]) == gpus
        assert world_size(args) == int(torchrun["--nnodes"]) * gpus
        assert torchrun["--master-addr"] == "LWS_LEADER_ADDRESS"
        assert torchrun["--node-rank"] == ("0" if role == "leader" else "LWS_WORKER_INDEX")
    else:  # serve spawns the mesh's ranks in the pod
        assert world_size(args) == gpus
    env = {e["name"]: e for e in container.get("env", [])}
    assert args.host == "0.0.0.0" and "secretKeyRef" in env["MESHDIT_API_KEY"]["valueFrom"], \
        "a non-loopback --host needs an API key (serve refuses it otherwise)"
    if role == "worker":
        return  # only rank 0 answers HTTP
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == args.port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    notes = meta["annotations"]
    assert notes["prometheus.io/scrape"] == "true" and int(notes["prometheus.io/port"]) == args.port
    assert notes["prometheus.io/path"] == "/metrics"


@pytest.mark.parametrize("name", ["serve.yaml", "serve-multinode.yaml"])
def test_the_service_selects_the_pods_that_answer_http(name):
    docs = documents(name)
    (service,) = [d for d in docs if d["kind"] == "Service"]
    (_, _, meta), *_ = [t for d in docs for t in pod_templates(d) if t[0] in ("pod", "leader")]
    assert service["spec"]["selector"].items() <= meta["labels"].items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_the_autoscaler_scales_the_deployment_on_a_metric_serve_exports():
    (hpa,) = documents("hpa.yaml")
    (deployment,) = [d for d in documents("serve.yaml") if d["kind"] == "Deployment"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    exported = Metrics().render().decode()
    for metric in hpa["spec"]["metrics"]:
        assert re.search(rf"^# TYPE {metric['pods']['metric']['name']} ", exported, re.MULTILINE), metric


@pytest.mark.parametrize("flag, message", [("--ulysses-degre", "spell serve's flags out"),
                                           ("--ulysess-degree", "meshdit serve refuses"),
                                           ("--prompt", "meshdit serve refuses")])  # generate's, not serve's
def test_a_flag_serve_does_not_take_is_caught(flag, message):
    with pytest.raises(AssertionError, match=message):
        serve_args(["meshdit", "serve", flag, "2", "--model", "m"])
