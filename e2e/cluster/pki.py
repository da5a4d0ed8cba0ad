"""Certificates and keys for the local control plane.

Why: kube-apiserver authenticates every component and the test client by client certificate,
and signs service-account tokens with a key pair; a fresh throw-away PKI per cluster directory
keeps the test cluster as close to a production one (RBAC on, no anonymous admin) as possible.
Guarantees: generating twice into the same folder keeps what is there (so a restarted cluster
keeps working kubeconfigs); every private key is written with mode 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)

# Client identities: (file stem, common name, organisation). The built-in RBAC bindings give
# system:kube-controller-manager and system:kube-scheduler exactly what those components need.
CLIENTS: tuple[tuple[str, str, str | None], ...] = (
    ("admin", "elastra-admin", "system:masters"),
    ("controller-manager", "system:kube-controller-manager", None),
    ("scheduler", "system:kube-scheduler", None),
    ("kwok", "kwok-controller", "system:masters"),
)


@dataclass(frozen=True)
class Pki:
    """Paths of the generated files (PEM)."""

    root: Path

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.root / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.root / "apiserver.key"

    @property
    def sa_key(self) -> Path:
        return self.root / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.root / "sa.pub"

    def client_cert(self, name: str) -> Path:
        return self.root / f"{name}.crt"

    def client_key(self, name: str) -> Path:
        return self.root / f"{name}.key"


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.touch(mode=0o600)
    path.write_bytes(pem)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(common_name: str, organisation: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organisation:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organisation))
    return x509.Name(attrs)


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
    )


def _make_ca(pki: Pki) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _new_key()
    name = _name("elastra-local-ca")
    cert = (
        _builder(name, name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_key(pki.ca_key, key)
    _write_cert(pki.ca_cert, cert)
    return cert, key


def _load_ca(pki: Pki) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{pki.ca_key} is not an EC key; delete {pki.root} to regenerate")
    return cert, key


def _issue(
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    subject: x509.Name,
    *,
    server_names: tuple[str, ...] = (),
    server_ips: tuple[str, ...] = (),
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_cert, ca_key = ca
    key = _new_key()
    usage = [ExtendedKeyUsageOID.SERVER_AUTH] if server_names else [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = (
        _builder(subject, ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if server_names or server_ips:
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def _serves(cert_path: Path, ip: str) -> bool:
    """True when the serving certificate exists and names ip (the service range may change)."""
    if not cert_path.exists():
        return False
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return ipaddress.ip_address(ip) in sans.get_values_for_type(x509.IPAddress)


def ensure_pki(root: Path, *, service_ip: str, extra_ips: tuple[str, ...] = ()) -> Pki:
    """Create the CA, the apiserver serving pair, client pairs and the service-account keys.

    Files that already exist are kept, so kubeconfigs written earlier stay valid; the serving
    certificate is reissued when it does not name service_ip (and each of extra_ips: the node's
    own address when a real node's pods reach the API server through it).
    """
    root.mkdir(parents=True, exist_ok=True)
    pki = Pki(root)
    ca = _load_ca(pki) if pki.ca_cert.exists() and pki.ca_key.exists() else _make_ca(pki)
    if not all(_serves(pki.serving_cert, ip) for ip in (service_ip, *extra_ips)):
        cert, key = _issue(
            ca,
            _name("kube-apiserver"),
            server_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            server_ips=("127.0.0.1", service_ip, *extra_ips),
        )
        _write_key(pki.serving_key, key)
        _write_cert(pki.serving_cert, cert)
    for stem, common_name, organisation in CLIENTS:
        if pki.client_cert(stem).exists():
            continue
        cert, key = _issue(ca, _name(common_name, organisation))
        _write_key(pki.client_key(stem), key)
        _write_cert(pki.client_cert(stem), cert)
    if not pki.sa_key.exists():
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        _write_key(pki.sa_key, sa_key)
        pki.sa_pub.write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return pki


def ensure_client_cert(pki: Pki, stem: str, common_name: str, organisation: str | None) -> None:
    """A client pair <stem>.crt/.key signed by the cluster CA (kept when it exists)."""
    if pki.client_cert(stem).exists() and pki.client_key(stem).exists():
        return
    cert, key = _issue(_load_ca(pki), _name(common_name, organisation))
    _write_key(pki.client_key(stem), key)
    _write_cert(pki.client_cert(stem), cert)


def ensure_serving_cert(
    pki: Pki, stem: str, *, names: tuple[str, ...], ips: tuple[str, ...]
) -> None:
    """A serving pair <stem>.crt/.key for names and ips (reissued when an IP is missing)."""
    path = pki.client_cert(stem)
    if path.exists() and pki.client_key(stem).exists() and all(_serves(path, ip) for ip in ips):
        return
    cert, key = _issue(_load_ca(pki), _name(names[0]), server_names=names, server_ips=ips)
    _write_key(pki.client_key(stem), key)
    _write_cert(path, cert)
