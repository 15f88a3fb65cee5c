"""deploy/kubernetes/ parses, and starts what docs/serving.md says: every container's `meshdit serve` flags parse with
serve's own argument parser, the probes, Service and Prometheus annotations point at its --port, a key is set for
--host 0.0.0.0, the GPUs asked for match the degrees, and the HPA scales on a metric the server exports."""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml

from meshdit.cli import build_parser
from meshdit.serve.command import check_exposure
from meshdit.serve.metrics import Metrics
from meshdit.serve.schemas import ImageRequest

FOLDER = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
DOCUMENTS = [doc for path in sorted(FOLDER.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]


def pod_specs() -> list[tuple[dict, dict, int]]:
    """(pod template metadata, pod spec, nodes of the mesh) of every workload."""
    out = []
    for doc in DOCUMENTS:
        if doc["kind"] == "Deployment":
            template = doc["spec"]["template"]
            out.append((template["metadata"], template["spec"], 1))
        elif doc["kind"] == "LeaderWorkerSet":
            lws = doc["spec"]["leaderWorkerTemplate"]
            for part in ("leaderTemplate", "workerTemplate"):
                out.append((lws[part]["metadata"], lws[part]["spec"], lws["size"]))
    return out


def serve_args(container: dict) -> tuple[list[str], dict]:
    """(serve's flags, torchrun's options as {name: value}) of a container running `meshdit serve`."""
    words = [str(w) for w in container["command"] + container.get("args", [])]
    if words[:2] == ["meshdit", "serve"]:
        return words[2:], {}
    assert words[0] == "torchrun", words
    start = words.index("-m")
    assert words[start + 1:start + 3] == ["meshdit", "serve"], words
    options = dict(re.fullmatch(r"--([\w-]+)=(.*)", w).groups() for w in words[1:start])
    return words[start + 3:], options


def test_the_manifests_hold_every_workload_the_docs_name():
    kinds = sorted(doc["kind"] for doc in DOCUMENTS)
    assert kinds == ["Deployment", "HorizontalPodAutoscaler", "LeaderWorkerSet", "Service", "Service"]


@pytest.mark.parametrize("metadata, spec, nodes", pod_specs(),
                         ids=[m["labels"].get("role", m["labels"]["app"]) for m, _, _ in pod_specs()])
def test_each_container_runs_serve_with_flags_serve_takes(metadata, spec, nodes):
    [container] = spec["containers"]
    flags, torchrun = serve_args(container)
    args = build_parser().parse_args(["serve", *flags])  # an unknown or misspelt flag: SystemExit
    env = {e["name"] for e in container.get("env", [])}
    check_exposure(args.host, "set" if "MESHDIT_API_KEY" in env else args.api_key, args.allow_unauthenticated)
    degrees = math.prod(getattr(args, name) for name in ("ulysses_degree", "ring_degree", "pipefusion_parallel_degree",
                                                         "data_parallel_degree", "tensor_parallel_degree", "cfg_degree"))
    per_node = int(torchrun.get("nproc-per-node", degrees))
    assert container["resources"]["limits"]["nvidia.com/gpu"] == per_node  # one GPU per rank
    assert per_node * nodes == degrees
    if torchrun:
        assert torchrun["nnodes"] == "$(LWS_GROUP_SIZE)" and torchrun["master-addr"] == "$(LWS_LEADER_ADDRESS)"
    if metadata["labels"].get("role") == "worker":  # rank 0 (on the leader) serves; workers follow its batches
        assert "readinessProbe" not in container
        return
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == args.port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    annotations = metadata["annotations"]
    assert (annotations["prometheus.io/scrape"], int(annotations["prometheus.io/port"]),
            annotations["prometheus.io/path"]) == ("true", args.port, "/metrics")
    # the drain (SIGTERM: the running job finishes) fits in the grace period
    assert spec["terminationGracePeriodSeconds"] >= args.request_timeout


def test_leader_and_workers_run_the_same_mesh():
    [lws] = [doc for doc in DOCUMENTS if doc["kind"] == "LeaderWorkerSet"]
    templates = lws["spec"]["leaderWorkerTemplate"]
    leader, worker = (serve_args(templates[t]["spec"]["containers"][0]) for t in ("leaderTemplate", "workerTemplate"))
    assert leader == worker


def test_services_reach_the_serving_port_and_the_hpa_scales_on_an_exported_metric():
    served_ports = {str(build_parser().parse_args(["serve", *serve_args(spec["containers"][0])[0]]).port)
                    for _, spec, _ in pod_specs()}
    for service in (doc for doc in DOCUMENTS if doc["kind"] == "Service"):
        assert {str(p["targetPort"]) for p in service["spec"]["ports"]} <= served_ports
        assert service["spec"]["sessionAffinity"] == "ClientIP"  # a job's polls reach the replica that holds it
    [hpa] = [doc for doc in DOCUMENTS if doc["kind"] == "HorizontalPodAutoscaler"]
    exported = Metrics().render().decode()
    for metric in hpa["spec"]["metrics"]:
        assert re.search(rf"^{metric['pods']['metric']['name']} ", exported, re.M), metric


def test_synchronous_answers_carry_the_images_inline():
    """Any replica can answer POST /v1/images/generations: the images are in the answer (b64_json, the default and
    only format), not behind a URL that resolves on one replica."""
    assert ImageRequest.model_fields["response_format"].default == "b64_json"
    assert ImageRequest.model_validate({"prompt": "x"}).response_format == "b64_json"
