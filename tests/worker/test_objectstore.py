"""Checkpoints in an object store, against a real S3 server (moto's, on 127.0.0.1).

Each test gets a bucket of its own on one server per module; the client finds the server the
way a pod does, through ``AWS_ENDPOINT_URL`` and the AWS credential variables. The commit
protocol's rules are those of test_layout.py and test_checkpoint.py; here they are checked
where the storage differs: no rename, ``latest`` as the commit point, listings of prefixes.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch
import torch.distributed as dist
from moto.server import ThreadedMotoServer

from elastra_worker import exitcodes
from elastra_worker.api import Session
from elastra_worker.assignment import AssignmentError, assignment_from_env, parse_assignment
from elastra_worker.checkpoint import Checkpointer
from elastra_worker.layout import LATEST, MANIFEST, CheckpointError, UnusableRootError
from elastra_worker.models.llama import make_batch
from elastra_worker.objectstore import ObjectCheckpointRoot
from elastra_worker.parallel_model import build_parallel, llama_recipe

from .distributed import TINY, free_port, run_world
from .test_checkpoint import gloo_group
from .test_parallel_model import port_block


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """A real S3 API over HTTP on a free loopback port, for the whole module."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def s3_env(endpoint: str, tmp: Path, *, credentials: bool = True) -> dict[str, str]:
    """The variables a pod's template would set (a Secret's keys and the endpoint).

    No shared config or credential files and no instance metadata: only what is given here.
    """
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(tmp / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "no-aws-credentials"),
    }
    if credentials:
        env |= {"AWS_ACCESS_KEY_ID": "elastra-test", "AWS_SECRET_ACCESS_KEY": "elastra-test"}
    return env


@pytest.fixture
def s3(s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """``s3://<a fresh bucket>/ckpt``, with this process's environment pointing at the server."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_env(s3_endpoint, tmp_path).items():
        monkeypatch.setenv(name, value)
    bucket = f"elastra-{uuid.uuid4().hex[:12]}"
    fsspec.filesystem("s3", skip_instance_cache=True).mkdir(bucket)
    return f"s3://{bucket}/ckpt"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[None]:
    store = dist.FileStore(str(tmp_path / "store"), 1)  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def saver(root: ObjectCheckpointRoot, *, version: int, keep: int = 10) -> Checkpointer:
    return Checkpointer(root, group=None, world_version=version, keep=keep, thread_count=2)


def save(ckpt: Checkpointer, step: int) -> None:
    ckpt.save({"w": torch.full((64,), float(step)), "b": torch.arange(3) + step}, step=step,
              extra={"plan": "dp1"})  # fmt: skip


def restored(root: ObjectCheckpointRoot, *, version: int) -> tuple[int | None, float | None]:
    """What a new world finds and loads: (step, the value of ``w``)."""
    ckpt = saver(root, version=version)
    manifest = ckpt.find_loadable()
    if manifest is None:
        return None, None
    state = {"w": torch.zeros(64), "b": torch.zeros(3, dtype=torch.int64)}
    ckpt.load(state, manifest)
    assert state["b"].tolist() == [manifest.step + i for i in range(3)]
    return manifest.step, float(state["w"][0])


def flip_byte(root: ObjectCheckpointRoot, step: int, pick: Callable[[str], bool]) -> str:
    """Overwrite one object of ``step`` with a same-size copy that has one byte flipped."""
    prefix = f"{root.path}/step-{step:09d}"
    key = next(k for k in sorted(root.fs.find(prefix)) if pick(k.rsplit("/", 1)[1]))
    data = bytearray(root.fs.cat_file(key))
    data[len(data) // 2] ^= 0xFF
    root.fs.pipe_file(key, bytes(data))
    return key


def test_save_then_load_round_trip(s3: str, world: None) -> None:
    root = ObjectCheckpointRoot(s3, job="j")
    root.probe()
    first = saver(root, version=1)
    for step in (2, 4):
        save(first, step)
    assert root.fs.cat_file(f"{root.path}/{LATEST}") == b"step-000000004\n"
    manifest = root.check_structure(4)
    objects = {
        k.rsplit("/", 1)[1]: root.fs.size(k) for k in root.fs.find(f"{root.path}/step-000000004")
    }
    assert {n: e.size for n, e in manifest.files.items()} == {
        n: s for n, s in objects.items() if n != MANIFEST
    }
    assert manifest.world_version == 1 and manifest.extra == {"plan": "dp1"}
    assert root.candidates() == [4, 2]
    assert restored(root, version=2) == (4, 4.0)


def test_every_object_is_hashed_while_it_is_written_not_read_back(
    s3: str, world: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = ObjectCheckpointRoot(s3, job="j")
    asked: list[str] = []
    read_back = root.hash_saved

    def recording(location: str, names: list[str]) -> dict[str, Any]:
        asked.extend(names)
        return dict(read_back(location, names))

    monkeypatch.setattr(root, "hash_saved", recording)
    save(saver(root, version=1), 2)
    assert asked == []
    files = root.check_structure(2).files
    assert ".metadata" in files and len(files) > 2  # and the shards of two writer threads
    root.check_hashes(2, sorted(files))  # and the running hashes are the objects' hashes


def test_a_corrupt_shard_falls_back_to_the_older_step(
    s3: str, world: None, caplog: pytest.LogCaptureFixture
) -> None:
    root = ObjectCheckpointRoot(s3, job="j")
    first = saver(root, version=1)
    for step in (2, 4):
        save(first, step)
    key = flip_byte(root, 4, lambda name: name.endswith(".distcp"))
    root.check_structure(4)  # sizes still match: only the hash finds it
    with caplog.at_level(logging.WARNING):
        assert restored(root, version=2) == (2, 2.0)
    assert f"s3://{key}: sha256 mismatch (corrupt shard)" in caplog.text
    assert "checkpoint step 4 is not usable" in caplog.text


def test_a_missing_or_garbled_latest_falls_back_to_the_newest_verified_step(
    s3: str, world: None, caplog: pytest.LogCaptureFixture
) -> None:
    root = ObjectCheckpointRoot(s3, job="j")
    first = saver(root, version=1)
    for step in (2, 4, 6):
        save(first, step)
    root.fs.rm_file(f"{root.path}/{LATEST}")
    assert root.candidates() == [6, 4, 2]
    root.fs.pipe_file(f"{root.path}/step-000000006/{MANIFEST}", b"{not json")
    with caplog.at_level(logging.WARNING):
        assert restored(root, version=2) == (4, 4.0)
    assert f"{root.uri}/step-000000006/{MANIFEST}: malformed" in caplog.text
    root.fs.pipe_file(f"{root.path}/{LATEST}", b"\xff\xfe not utf-8")
    with caplog.at_level(logging.WARNING):
        assert restored(root, version=3) == (4, 4.0)
    assert f"ignoring checkpoint pointer {root.uri}/{LATEST}: not UTF-8" in caplog.text


class Killed(BaseException):
    """The process dies here (nothing after this point runs)."""


def save_in_background(ckpt: Checkpointer, step: int) -> None:
    """``save`` through the background writer: staged, written by a thread, waited for."""
    state = {"w": torch.full((64,), float(step)), "b": torch.arange(3) + step}
    ckpt.save_async(state, step=step, extra={"plan": "dp1"}, group=gloo_group())
    ckpt.wait()


WRITERS: dict[str, tuple[Callable[[Checkpointer, int], None], type[BaseException]]] = {
    "blocking": (save, Killed),
    # the background thread hands what ended it to the training thread at the next wait
    "background": (save_in_background, CheckpointError),
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_save_killed_between_manifest_and_latest_keeps_the_old_latest(
    s3: str, world: None, monkeypatch: pytest.MonkeyPatch, writer: str
) -> None:
    write, ended = WRITERS[writer]
    root = ObjectCheckpointRoot(s3, job="j")
    first = saver(root, version=1)
    for step in (2, 4):
        save(first, step)
    put = root.fs.pipe_file

    def die_at_latest(key: str, data: bytes) -> None:
        if key.endswith(f"/{LATEST}"):
            raise Killed
        put(key, data)

    monkeypatch.setattr(root.fs, "pipe_file", die_at_latest)
    with pytest.raises(ended):
        write(first, 6)
    later = ObjectCheckpointRoot(s3, job="j")  # a new pod: its own client
    later.check_structure(6)  # complete and verifiable, but never committed
    assert later.latest_step() == 4
    assert later.candidates() == [4, 2]
    assert restored(later, version=2) == (4, 4.0)
    second = saver(later, version=3)
    assert second.find_loadable() is not None
    save(second, 6)  # the uncommitted copy is replaced by this world's own save
    assert later.latest_step() == 6
    assert later.check_structure(6).world_version == 3


def test_pruning_keeps_the_newest_verified_steps(s3: str, world: None) -> None:
    root = ObjectCheckpointRoot(s3, job="j")
    first = saver(root, version=1, keep=2)
    for step in (2, 4, 6):
        save(first, step)
    assert root.own_steps() == [6, 4]
    assert root.fs.find(f"{root.path}/step-000000002") == []
    flip_byte(root, 6, lambda name: name == ".metadata")
    second = saver(root, version=2, keep=2)
    manifest = second.find_loadable()
    assert manifest is not None and manifest.step == 4
    second.load({"w": torch.zeros(64), "b": torch.zeros(3, dtype=torch.int64)}, manifest)
    save(second, 6)  # the corrupt 6 is replaced, the restored 4 kept
    assert root.own_steps() == [6, 4]
    save(second, 8)
    assert root.own_steps() == [8, 6, 4]  # the restored step stays while this world runs
    root.check_hashes(6, sorted(root.check_structure(6).files))


def test_two_jobs_under_one_prefix_never_see_each_other(s3: str, world: None) -> None:
    a, b = ObjectCheckpointRoot(s3, job="a"), ObjectCheckpointRoot(s3, job="b")
    saver_a = saver(a, version=1, keep=1)
    for step in (2, 4):
        save(saver_a, step)
    saver_b = saver(b, version=1, keep=1)
    for step in (10, 12):
        save(saver_b, step)
    assert (a.candidates(), b.candidates()) == ([4], [12])
    assert (a.latest_step(), b.latest_step()) == (4, 12)
    assert restored(a, version=2) == (4, 4.0)
    assert restored(b, version=2) == (12, 12.0)
    # another job's checkpoint copied into this job's root is refused, not loaded
    for key in a.fs.find(f"{a.path}/step-000000004"):
        a.fs.copy(key, key.replace(f"{a.path}/", f"{b.path}/"))
    with pytest.raises(CheckpointError, match="belongs to job 'a', not 'b'"):
        b.check_structure(4)


def test_a_checkpoint_uri_outside_the_supported_schemes_or_climbing_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported scheme 'gs'"):
        ObjectCheckpointRoot("gs://bucket/x", job="j")
    with pytest.raises(ValueError, match=r"without '\.\.'"):
        ObjectCheckpointRoot("s3://bucket/x/../other", job="j")
    with pytest.raises(ValueError, match="cannot name a prefix"):
        ObjectCheckpointRoot("s3://bucket/x", job="../j")


def in_world(checkpoint: dict[str, Any]) -> dict[str, Any]:
    return {"job": "j", "worldVersion": 1, "rank": 0, "worldSize": 1, "masterAddr": "m",
            "masterPort": 1, "globalBatchSize": 2, "checkpoint": checkpoint}  # fmt: skip


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("gs://bucket/x", "checkpoint.uri: unsupported scheme 'gs'"),
        ("s3:///x", "checkpoint.uri: expected s3://BUCKET[/PREFIX]"),
        ("s3://bucket/a/../../b", "checkpoint.uri: expected s3://BUCKET[/PREFIX] without '..'"),
        ("s3://bucket/a\0b", "checkpoint.uri: contains a NUL character"),
        ("s3://bucket/" + "x" * 2048, "checkpoint.uri: 2060 characters, at most 2048"),
    ],
)
def test_the_assignment_refuses_a_bad_uri_naming_the_field(uri: str, message: str) -> None:
    with pytest.raises(AssignmentError) as err:
        parse_assignment(in_world({"uri": uri}))
    assert str(err.value).startswith(message)


def test_the_assignment_normalises_the_uri_and_needs_no_path_with_it() -> None:
    got = parse_assignment(in_world({"uri": "s3://bucket//team/ckpt/"})).checkpoint
    assert (got.uri, got.path) == ("s3://bucket/team/ckpt", "")
    env = {"ELASTRA_CHECKPOINT_URI": "s3://bucket/run"}
    assert assignment_from_env(env).checkpoint.uri == "s3://bucket/run"
    assert assignment_from_env({}).checkpoint.uri == ""


def test_probe_names_a_missing_bucket_and_missing_credentials(
    s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(UnusableRootError, match="bucket does not exist"):
        ObjectCheckpointRoot("s3://no-such-bucket/ckpt", job="j").probe()
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(UnusableRootError, match="Unable to locate credentials"):
        ObjectCheckpointRoot(s3, job="j").probe()


SESSION_START = """
import sys, torch
from elastra_worker.api import Session
from elastra_worker.assignment import AssignmentError, assignment_from_env, parse_assignment
a = parse_assignment({"job": "j", "worldVersion": 1, "rank": 0, "worldSize": 1,
    "masterAddr": "127.0.0.1", "masterPort": int(sys.argv[2]), "globalBatchSize": 2,
    "plan": {"dp": 1, "microBatchSize": 2}, "checkpoint": {"uri": sys.argv[1]}})
with Session(a, device=torch.device("cpu"), rendezvous_timeout_s=30):
    print("started")
"""


def start_session(uri: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SESSION_START, uri, str(free_port())],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("case", ["no-bucket", "no-credentials"])
def test_an_unusable_root_fails_the_session_at_start_with_exit_2(
    s3: str, s3_endpoint: str, tmp_path: Path, case: str
) -> None:
    uri = "s3://no-such-bucket/ckpt" if case == "no-bucket" else s3
    env = s3_env(s3_endpoint, tmp_path, credentials=case != "no-credentials")
    proc = start_session(uri, env)
    assert proc.returncode == exitcodes.CONFIG, proc.stderr
    assert "started" not in proc.stdout
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "is not usable" in line]
    assert len(lines) == 1, proc.stderr
    assert f"checkpoint.uri {uri}/j is not usable" in lines[0]


def test_an_unreachable_endpoint_is_retryable_not_permanent(tmp_path: Path) -> None:
    """Nothing listens on the port: maybe an outage, so a new world tries again (exit 75)."""
    proc = start_session("s3://bucket/ckpt", s3_env(f"http://127.0.0.1:{free_port()}", tmp_path))
    assert proc.returncode == exitcodes.RETRYABLE, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "cannot reach" in line]
    assert len(lines) == 1, proc.stderr
    assert "checkpoint.uri s3://bucket/ckpt/j: cannot reach the object store" in lines[0]


def test_the_same_session_starts_with_a_usable_root(
    s3: str, s3_endpoint: str, tmp_path: Path
) -> None:
    """The control for the test above: only the bucket or the credentials made it fail."""
    proc = start_session(s3, s3_env(s3_endpoint, tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "started" in proc.stdout


def _train_on_s3(rank: int, world: int, uri: str, run: tuple[int, int, int]
                 ) -> tuple[int, list[float]]:  # fmt: skip
    """One pod's trainer: restore from ``uri``, train the reference model to ``steps``, save.

    ``run`` is (store port, world version, steps).
    """
    port, version, steps = run
    a = parse_assignment({
        "job": "resize", "worldVersion": version, "rank": rank, "worldSize": world,
        "masterAddr": "127.0.0.1", "masterPort": port, "plan": {"microBatchSize": 2},
        "globalBatchSize": 8, "consistency": "data",
        "checkpoint": {"uri": uri, "intervalSeconds": 0, "keep": 2},
    })  # fmt: skip
    sess = Session(a, rendezvous_timeout_s=60, collective_timeout_s=60, device=torch.device("cpu"))
    losses: list[float] = []
    with sess:
        model = build_parallel(sess, llama_recipe(TINY))
        opts = [torch.optim.AdamW(p.parameters(), lr=1e-2) for p in model.parts]
        start = sess.restore(model.parts, opts)
        for batch in sess.batches(dataset_size=512, total_steps=steps):
            model.train_step(batch, lambda samples: make_batch(samples, TINY, 0))
            losses.append(sess.step(opts)["loss"])
    return start, losses


@pytest.mark.slow
def test_a_world_of_two_checkpoints_to_s3_and_a_world_of_one_resumes(s3: str) -> None:
    ports = port_block(3)
    first = run_world(_train_on_s3, 2, s3, (ports[0], 1, 3), timeout=180, form_world=False)
    assert [start for start, _ in first] == [0, 0]
    root = ObjectCheckpointRoot(s3, job="resize")
    assert root.latest_step() == 3
    manifest = root.check_structure(3)
    assert manifest.world_size == 2
    writers = {n.split("_")[2] for n in manifest.files if n.endswith(".distcp")}
    assert writers == {"0", "1"}  # both ranks' shards, each rank's own objects
    second = run_world(_train_on_s3, 1, s3, (ports[1], 2, 5), timeout=180, form_world=False)
    start, losses = second[0]
    assert start == 3 and len(losses) == 2
    assert root.latest_step() == 5 and root.check_structure(5).world_size == 1
    # and back to two, from the one-rank world's checkpoint
    third = run_world(_train_on_s3, 2, s3, (ports[2], 3, 6), timeout=180, form_world=False)
    assert [s for s, _ in third] == [5, 5]
    assert root.own_steps() == [6, 5]  # keep: 2
