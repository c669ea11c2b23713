"""Certificates and kubeconfigs for the local control plane.

One CA signs the apiserver's serving certificate and a client certificate per component, each with
the identity Kubernetes' default RBAC expects (system:kube-controller-manager, system:kube-scheduler),
so authorization in tests is the real thing rather than everyone being cluster-admin. It also signs
the kubelet API's serving certificate (`kubelet`, served by a pod runner for `kubectl logs`) and the
client certificate the apiserver presents there (`apiserver-kubelet-client`), as kubeadm does.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=3650)

# Client identities: file stem -> (common name, organisation).
CLIENTS: dict[str, tuple[str, str | None]] = {
    "admin": ("fleetpilot-admin", "system:masters"),
    "controller-manager": ("system:kube-controller-manager", None),
    "scheduler": ("system:kube-scheduler", None),
    "kwok": ("kwok-controller", "system:masters"),
}


#: The kubelet API's serving certificate, and the apiserver's client certificate for it.
KUBELET = "kubelet"
KUBELET_CLIENT = "apiserver-kubelet-client"


@dataclass(frozen=True)
class Pki:
    """Paths of the generated material in one folder."""

    folder: Path

    def crt(self, stem: str) -> Path:
        return self.folder / f"{stem}.crt"

    def key(self, stem: str) -> Path:
        return self.folder / f"{stem}.key"

    @property
    def ca(self) -> Path:
        return self.crt("ca")

    @property
    def service_account_key(self) -> Path:
        return self.folder / "sa.key"

    @property
    def service_account_pub(self) -> Path:
        return self.folder / "sa.pub"

    def complete(self) -> bool:
        stems = ["ca", "apiserver", KUBELET, KUBELET_CLIENT, *CLIENTS]
        return self.service_account_key.is_file() and all(self.crt(s).is_file() and self.key(s).is_file() for s in stems)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _name(common_name: str, organisation: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organisation:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organisation))
    return x509.Name(attributes)


def ensure(folder: Path, *, service_ip: str) -> Pki:
    """Create the CA, serving and client certificates once; reuse them afterwards."""
    pki = Pki(folder)
    if pki.complete():
        return pki
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("fleetpilot-dev-ca")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(pki.key("ca"), ca_key)
    pki.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))

    def issue(stem: str, subject: x509.Name, usage: x509.ObjectIdentifier, sans: list[x509.GeneralName]) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        _write_key(pki.key(stem), key)
        pki.crt(stem).write_bytes(builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))

    dns_names = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 "kubernetes.default.svc.cluster.local"]
    issue(
        "apiserver",
        _name("kube-apiserver"),
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName(n) for n in dns_names]
        + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", service_ip)],
    )
    for stem, (common_name, organisation) in CLIENTS.items():
        issue(stem, _name(common_name, organisation), ExtendedKeyUsageOID.CLIENT_AUTH, [])
    issue(KUBELET, _name("fleetpilot-dev-kubelet"), ExtendedKeyUsageOID.SERVER_AUTH,
          [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    issue(KUBELET_CLIENT, _name("kube-apiserver-kubelet-client", "system:masters"), ExtendedKeyUsageOID.CLIENT_AUTH, [])

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.service_account_key, sa_key)
    pki.service_account_pub.write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return pki


def kubeconfig(*, cluster_name: str, server: str, ca: str, user: str, credentials: Mapping[str, str],
               namespace: str | None = None) -> dict[str, Any]:
    """The one kubeconfig every local client gets: one cluster (its server and CA file), one user with
    `credentials` (a client certificate and key, or a ServiceAccount `token`), and the context joining
    them, current, in `namespace` if given. Every kubeconfig the dev cluster, the tests, the benchmarks
    and the e2e pod runner write is this document."""
    context: dict[str, str] = {"cluster": cluster_name, "user": user}
    if namespace is not None:
        context["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": {"server": server, "certificate-authority": ca}}],
        "users": [{"name": user, "user": dict(credentials)}],
        "contexts": [{"name": cluster_name, "context": context}],
        "current-context": cluster_name,
    }


def write_kubeconfig(path: Path, *, pki: Pki, stem: str, server: str, cluster_name: str) -> Path:
    """A kubeconfig authenticating as the client certificate `stem`."""
    config = kubeconfig(cluster_name=cluster_name, server=server, ca=str(pki.ca), user=stem,
                        credentials={"client-certificate": str(pki.crt(stem)), "client-key": str(pki.key(stem))})
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
