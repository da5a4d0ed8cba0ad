"""Kueue's real manager against the real local control plane, for the admission tests.

The manager is the binary e2e/toolchain/build.sh builds from Kueue's Go module (its CRDs are
copied from the same module); nothing is mocked. It runs as a process of this test session
with a Configuration that manages only what is labelled (``manageJobsWithoutQueueName:
false``), knows TrainingJobs as an external framework, elects no leader, manages no
certificates and serves metrics and health on free loopback ports. Its webhooks are not
registered with the API server (the operator creates complete Workloads), but the manager
serves them anyway, so it gets a self-signed certificate made here. Without internal
certificate management Kueue v0.17 also reads a metrics certificate from the fixed path
/etc/kueue/metrics/certs: the manager runs in a mount namespace of its own in which /etc is an
overlay (see ``private_etc``), so that certificate goes there and the host's /etc is untouched.

Kueue's CRDs stay installed after the session (other tests ignore them); every queue object a
test makes is cluster-scoped or in the test's namespace and is deleted with it.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from e2e.cluster.api import probe_http_health, wait_for
from e2e.cluster.components import free_ports, wait_crds_established

from tests.integration.conftest import LocalCluster

# The operator's own fixtures: elastra run on the test's namespace, its log on failure.
from tests.integration.operator.conftest import (  # noqa: F401
    jobs,
    operator,
    pytest_runtest_makereport,
)

REPO = Path(__file__).resolve().parents[3]
BUILD = REPO / "e2e" / "toolchain" / "build.sh"
KUEUE_NAMESPACE = "kueue-system"
EXTERNAL_FRAMEWORK = "TrainingJob.v1alpha1.elastra.dev"


@dataclass
class KueueProcess:
    """The Kueue manager process and what it printed (shown when a test fails)."""

    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip())

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def kueue_dir() -> Path:
    """Kueue's folder in the toolchain cache (bin/kueue, crds/), built by the collection hook."""
    out = subprocess.run(
        [str(BUILD), "--print-kueue-dir"], check=True, capture_output=True, text=True
    )
    found = Path(out.stdout.strip().splitlines()[-1])
    if not (found / "MANIFEST").is_file():
        pytest.fail(f"Kueue is not built in {found}: run e2e/toolchain/build.sh (make toolchain)")
    return found


def self_signed(cert_dir: Path) -> None:
    """tls.crt/tls.key for the webhook server Kueue insists on serving (nothing calls it)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kueue-webhook-service")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_dir.mkdir(parents=True, exist_ok=True)
    (cert_dir / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (cert_dir / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def private_etc(work: Path, certs: Path, argv: list[str]) -> list[str]:
    """``argv`` run in a private mount namespace whose /etc has ``certs`` at
    /etc/kueue/metrics/certs (an overlay: writes land in ``work``, never in the host's /etc)."""
    (work / "upper").mkdir(parents=True, exist_ok=True)
    (work / "scratch").mkdir(parents=True, exist_ok=True)
    script = (
        'mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc'
        ' && mkdir -p /etc/kueue/metrics && cp -r "$3" /etc/kueue/metrics/certs'
        ' && shift 3 && exec "$@"'
    )
    return [
        "unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
        str(work / "upper"), str(work / "scratch"), str(certs), *argv,
    ]  # fmt: skip


def configuration(cert_dir: Path, *, health: int, metrics: int, webhook: int) -> dict[str, Any]:
    """Kueue's Configuration for the tests (config.kueue.x-k8s.io/v1beta2)."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics}"},
        "webhook": {"host": "127.0.0.1", "port": webhook, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {
            "frameworks": ["batch/job"],  # Kueue refuses an empty list
            "externalFrameworks": [EXTERNAL_FRAMEWORK],
        },
        # The visibility API server binds a fixed port and exits the manager when it cannot.
        "featureGates": {"VisibilityOnDemand": False},
    }


def install_crds(cluster: LocalCluster, crds: Path) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
    wait_crds_established(lambda *args: cluster.kubectl(*args).stdout, "-f", str(crds))


@pytest.fixture(scope="session")
def kueue(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KueueProcess]:
    """Kueue's manager, running against the test cluster for the whole session."""
    built = kueue_dir()
    install_crds(cluster, built / "crds")
    cluster.kubectl("create", "namespace", KUEUE_NAMESPACE, check=False)
    work = tmp_path_factory.mktemp("kueue")
    self_signed(work / "certs")
    health, metrics, webhook = free_ports(3)
    config = work / "config.yaml"
    settings = configuration(work / "certs", health=health, metrics=metrics, webhook=webhook)
    config.write_text(yaml.safe_dump(settings))
    argv = [str(built / "bin" / "kueue"), f"--config={config}", "--zap-log-level=2"]
    process = subprocess.Popen(
        private_etc(work / "etc", work / "certs", argv),
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    manager = KueueProcess(process)
    threading.Thread(target=manager.pump, daemon=True).start()
    try:
        wait_for(
            "Kueue's manager ready",
            lambda: (
                probe_http_health(f"http://127.0.0.1:{health}/readyz")
                or (process.poll() is not None and _died(manager))
            ),
            timeout=120,
            interval=0.5,
            hint=lambda: "\n".join(manager.lines[-30:]),
        )
        yield manager
    finally:
        manager.stop()


def _died(manager: KueueProcess) -> bool:
    log = "\n".join(manager.lines[-40:])
    raise AssertionError(f"Kueue's manager exited with {manager.process.returncode}:\n{log}")
