"""e2e/kind: the node image's conventions that kind relies on, and the private docker daemon.

kind reads these from the node image (checked against kind v0.33.0's source): a one-line
/kind/version, CNI and storage manifests it applies (the CNI one as a Go template when it says
so), and on cgroup v1 a "detected cgroup v1" line in the container log before it runs
anything in the node. A typo in any of them shows only minutes into `kind create cluster`.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path

import pytest
import yaml
from e2e.images.archive import layer_from_files
from e2e.kind import boottest, cluster, dockerd, nodeimage

NODE = nodeimage.NODE_FILES
KIND_CGROUP_READY = re.compile("Reached target .*Multi-User System.*|detected cgroup v1")


def test_the_entrypoint_prints_the_line_kind_waits_for_on_cgroup_v1() -> None:
    entrypoint = NODE / "usr/local/bin/entrypoint"
    assert entrypoint.stat().st_mode & stat.S_IXUSR
    logged = re.findall(r'log "([^"]*)"', entrypoint.read_text())
    assert any(KIND_CGROUP_READY.search(line) for line in logged)


def test_the_cni_manifest_is_a_template_kind_fills_in() -> None:
    text = (NODE / "kind/manifests/default-cni.yaml").read_text()
    assert "would you kindly template this file" in text
    docs = list(yaml.safe_load_all(text.replace("{{ .PodSubnet }}", "10.244.0.0/16")))
    config = next(d for d in docs if d["kind"] == "ConfigMap")
    assert config["data"]["podSubnet"] == "10.244.0.0/16"
    # The node side reads exactly this ConfigMap.
    script = (NODE / "usr/local/bin/elastra-kind-cni").read_text()
    assert f"configmap {config['metadata']['name']}" in script


def test_the_storage_manifest_has_one_default_class() -> None:
    docs = list(yaml.safe_load_all((NODE / "kind/manifests/default-storage.yaml").read_text()))
    defaults = [
        d
        for d in docs
        if d["kind"] == "StorageClass"
        and d["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"
    ]
    assert len(defaults) == 1


def test_enabled_units_exist_in_the_node_files_or_come_from_debian() -> None:
    ours = {p.name for p in (NODE / "etc/systemd/system").glob("*.service")}
    assert set(nodeimage.ENABLED_UNITS) - ours == {"containerd.service"}  # Debian's unit


def test_containerd_config_names_the_pause_placeholder_and_the_wrapper() -> None:
    config = (NODE / "etc/containerd/config.toml").read_text()
    assert '"@PAUSE_IMAGE@"' in config
    assert f'"/{nodeimage.NODE_BINARIES["runcwrap"]}"' in config


def test_kubeadm_images_are_keyed_by_component(tmp_path: Path) -> None:
    fake = tmp_path / "kubeadm"
    fake.write_text(
        "#!/bin/sh\n"
        "echo registry.k8s.io/kube-apiserver:v1.36.3\n"
        "echo registry.k8s.io/coredns/coredns:v1.14.2\n"
        "echo registry.k8s.io/pause:3.10.2\n"
        "echo registry.k8s.io/etcd:3.6.8-0\n"
    )
    fake.chmod(0o755)
    assert nodeimage.kubeadm_images(fake, "v1.36.3") == {
        "kube-apiserver": "registry.k8s.io/kube-apiserver:v1.36.3",
        "coredns": "registry.k8s.io/coredns/coredns:v1.14.2",
        "pause": "registry.k8s.io/pause:3.10.2",
        "etcd": "registry.k8s.io/etcd:3.6.8-0",
    }


def test_the_description_round_trips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELASTRA_CACHE", str(tmp_path))
    layer = layer_from_files({"kind/version": (b"v1.36.3\n", 0o644)}, tmp_path / "l.tar")
    image = nodeimage.PackedImage(
        "elastra.local/kind-node:v1.36.3", [layer], nodeimage.node_config([layer], "v1.36.3")
    )
    nodeimage.write_description(image)
    assert nodeimage.read_description() == image
    layer.path.unlink()
    with pytest.raises(SystemExit, match="missing"):
        nodeimage.read_description()


def test_dockerd_leaves_the_hosts_firewall_and_forwarding_alone(tmp_path: Path) -> None:
    layout = dockerd.DockerdDirs(tmp_path / "data", tmp_path / "run")
    argv = dockerd.dockerd_argv(layout, Path("/opt/runcwrap"))
    for flag in ("--iptables=false", "--ip-forward=false", "--ip-masq=false", "--bridge=none"):
        assert flag in argv
    assert "--default-runtime=elastra-runc" in argv
    assert "--add-runtime=elastra-runc=/opt/runcwrap" in argv
    assert f"--pidfile={layout.pidfile}" in argv


def test_a_pidfile_of_another_process_is_not_the_daemon(tmp_path: Path) -> None:
    layout = dockerd.DockerdDirs(tmp_path / "data", tmp_path / "run")
    layout.run.mkdir(parents=True)
    assert dockerd.read_pid(layout) is None
    layout.pidfile.write_text(f"{os.getpid()}\n")  # pytest, not dockerd
    assert dockerd.read_pid(layout) is None
    assert sys.executable  # the check above read /proc/<pid>/cmdline


def test_the_boot_test_container_is_privileged_like_a_kind_node() -> None:
    base: dict[str, object] = {
        "ociVersion": "1.0.2",
        "process": {"rlimits": [{}], "cwd": "/"},
        "linux": {},
    }
    spec = boottest.spec(base)
    process = spec["process"]
    assert isinstance(process, dict)
    assert "CAP_SYS_ADMIN" in process["capabilities"]["bounding"]
    assert "rlimits" not in process
    assert process["args"] == ["/usr/local/bin/entrypoint", "/sbin/init"]
    linux = spec["linux"]
    assert isinstance(linux, dict)
    assert {"type": "cgroup"} in linux["namespaces"]
    assert {"type": "network"} in linux["namespaces"]  # no packet leaves its own namespace


def test_down_removes_lib_modules_only_when_up_created_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ELASTRA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ELASTRA_KIND_RUN", str(tmp_path / "run"))
    monkeypatch.setenv("ELASTRA_KIND_DOCKERD", "1")  # ours, and not running: nothing to delete
    modules = tmp_path / "lib-modules"
    monkeypatch.setattr(cluster, "LIB_MODULES", modules)
    modules.mkdir()
    cluster.write_state("x", {"ours": True})  # it was there before `up`
    cluster.down("x", kind="/bin/false")
    assert modules.is_dir()
    cluster.write_state("x", {"ours": True, "created_lib_modules": True})
    cluster.down("x", kind="/bin/false")
    assert not modules.exists()
    assert not cluster.state_file("x").exists()


@pytest.mark.parametrize(
    ("clusters", "stopped"),
    [
        ("x\n", True),  # kind still lists the one being deleted: no other
        ("", True),
        ("x\nother\n", False),  # another chapter's cluster runs on the daemon
    ],
)
def test_down_stops_our_daemon_only_when_no_other_cluster_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clusters: str, stopped: bool
) -> None:
    monkeypatch.setenv("ELASTRA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ELASTRA_KIND_RUN", str(tmp_path / "run"))
    monkeypatch.setenv("ELASTRA_KIND_DOCKERD", "1")
    monkeypatch.setattr(dockerd, "read_pid", lambda layout: 1)  # ours, running
    stops: list[Path] = []
    monkeypatch.setattr(dockerd, "stop", lambda layout: stops.append(layout.run))
    kind = tmp_path / "kind"
    kind.write_text(f"#!/bin/sh\n[ \"$1\" = get ] && printf '{clusters}'\nexit 0\n")
    kind.chmod(0o755)
    shims = dockerd.DockerdDirs.default().shims  # PATH's first folder for our daemon's docker
    shims.mkdir(parents=True)
    (shims / "docker").write_text("#!/bin/sh\nexit 1\n")  # no network or volume to remove
    (shims / "docker").chmod(0o755)
    cluster.write_state("x", {"ours": True})
    cluster.down("x", kind=str(kind))
    assert stops == ([tmp_path / "run"] if stopped else [])
    assert not cluster.state_file("x").exists()


def test_two_clusters_keep_their_own_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two kind chapters on one daemon: the second's `up` left the first's state alone."""
    monkeypatch.setenv("ELASTRA_CACHE", str(tmp_path / "cache"))
    cluster.write_state("a", {"shared": "/v/a"})
    cluster.write_state("b", {"shared": "/v/b"})
    assert cluster.read_state("a") == {"shared": "/v/a"}
    assert cluster.read_state("b") == {"shared": "/v/b"}


def test_every_node_mounts_the_shared_claim_folder(tmp_path: Path) -> None:
    config = tmp_path / "kind.yaml"
    config.write_text((Path(cluster.REPO) / "e2e/kind-config.yaml").read_text())
    out = cluster.with_shared_volumes(config, tmp_path / "shared", tmp_path / "out.yaml")
    doc = yaml.safe_load(out.read_text())
    assert len(doc["nodes"]) == 4
    for node in doc["nodes"]:
        assert node["extraMounts"] == [
            {"hostPath": str(tmp_path / "shared"), "containerPath": cluster.SHARED_PV_PATH}
        ]
    # Applying it twice mounts once.
    again = cluster.with_shared_volumes(out, tmp_path / "shared", tmp_path / "again.yaml")
    assert yaml.safe_load(again.read_text()) == doc
