"""Shared fixtures: the bundled real model, tiny random checkpoints, the HF oracle, and the real
Kubernetes control plane with the chart installed (the code behind them: kvpilot_testing, in
testing/)."""

import functools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpilot_server.models.builtin import builtin_path
from kvpilot_testing.corpus import CORPUS
from kvpilot_testing.hf_reference import float32_reference
from kvpilot_testing.kube.cluster import Cluster, create_namespace
from kvpilot_testing.kube.controlplane import ControlPlane
from kvpilot_testing.kube.install import Installed, install
from kvpilot_testing.small_vocab import build_small_vocab_tokenizer
from kvpilot_testing.tiny import TINY_MODELS, build_tiny_model

pytest_plugins = [
    "kvpilot_testing.durations",  # every run's per-test times, to a JSON file
    "kvpilot_testing.server_pool",  # live `kvpilot serve` processes shared by their flags
]


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The bundled model itself: a test that asks for it is marked slow (kvpilot_testing.tiers)."""
    return builtin_path("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smollm2_tokenizer() -> Path:
    """The bundled model's directory, for its tokenizer only: the tiny models borrow it, and a
    test that only tokenizes is not slow."""
    return builtin_path("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, smollm2_tokenizer) -> "functools.partial[Path]":
    root = tmp_path_factory.mktemp("tiny")
    return functools.partial(_tiny, root, smollm2_tokenizer)


def _tiny(root: Path, tokenizer_dir: Path, name: str) -> Path:
    return build_tiny_model(name, root / name, tokenizer_dir)


@pytest.fixture(scope="session")
def small_vocab_dir(tmp_path_factory, smollm2_tokenizer) -> "functools.partial[Path]":
    """Tiny models on a tokenizer of 512 tokens trained in the run (kvpilot_testing.small_vocab):
    for tests that sample thousands of tokens."""
    root = tmp_path_factory.mktemp("small-vocab")
    tokenizer = build_small_vocab_tokenizer(root / "tokenizer", smollm2_tokenizer)
    return functools.partial(_tiny, root, tokenizer)


@pytest.fixture(params=sorted(TINY_MODELS))
def tiny_model(request, tiny_dir) -> Path:
    return tiny_dir(request.param)


@pytest.fixture(scope="session")
def corpus_ids(smollm2_tokenizer) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer)
    ids = tokenizer(CORPUS).input_ids
    return (ids * (2048 // len(ids) + 1))[:2048]


@functools.cache
def _hf_greedy(path: Path, prompt: tuple[int, ...], max_new_tokens: int) -> tuple[int, ...]:
    return tuple(float32_reference(path).greedy(list(prompt), max_new_tokens))


@pytest.fixture(scope="session")
def hf_greedy():
    """The oracle: HF generate(do_sample=False) in float32, one request at a time; its answers
    kept on disk between runs, keyed by versions, the model's files and the arguments
    (kvpilot_testing.hf_cache)."""

    def run(path: Path, prompt: list[int], max_new_tokens: int) -> list[int]:
        return list(_hf_greedy(path, tuple(prompt), max_new_tokens))

    return run


@pytest.fixture(scope="session")
def kube(tmp_path_factory) -> Iterator[Installed]:
    """etcd, kube-apiserver and kube-controller-manager on 127.0.0.1 for the whole session, with
    the chart installed by `helm install` (watching all namespaces): the CRD, the operator's
    ServiceAccount and RBAC; and one real operator under that ServiceAccount for every test
    whose namespace it watches (kvpilot_testing.kube.operator). Fails every test that uses it,
    saying why, if it cannot start."""
    from kvpilot_testing.kube.install import observe_namespaces
    from kvpilot_testing.kube.operator import WATCHED, Operator

    workdir = tmp_path_factory.mktemp("controlplane")
    plane, shared = ControlPlane(workdir), None
    try:
        plane.start(controller_manager=False)
        installed = install(plane, "--set", "watch.scope=All")
        observe_namespaces(plane)
        plane.start_controller_manager()  # its garbage collector sees the CRD from the start
        shared = Operator(installed.operator_kubeconfig, workdir / "operator.log", (f"{WATCHED}*",))
        installed.operator = shared.start()
        shared.wait()
        yield installed
    finally:
        if shared is not None:
            shared.stop()
        plane.stop()


@pytest.fixture
def kube_namespace(kube, request) -> Iterator[Cluster]:
    """A fresh namespace of the session's control plane for one test; the operator it starts
    runs under the chart's ServiceAccount."""
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{name}-{len(kube_namespaces)}"
    kube_namespaces.append(name)
    create_namespace(kube.plane, name)
    cluster = Cluster(kube.plane, name, kube.operator_kubeconfig)
    try:
        yield cluster
    finally:
        cluster.close()
        # Bound pods wait for a kubelet: none is left, so the namespace may stay Terminating.
        with kube.plane.client() as http:
            http.delete(f"/api/v1/namespaces/{name}")


kube_namespaces: list[str] = []  # every name used in this session, for unique new ones


@pytest.fixture(scope="module")
def tiny_server(server_pool, tiny_dir) -> Iterator[str]:
    """A live `kvpilot serve` of the tiny llama on 127.0.0.1 (its base URL), the session's one
    shared by every module that asks (kvpilot_testing.server_pool): a test may not change it for
    good, and reads its counters as changes across the test."""
    with server_pool.tiny(tiny_dir("llama")) as server:
        yield server.base
