"""RedisTier's credentials and TLS against real servers: ``requirepass``, an ACL user limited to its key
prefix, and a TLS-only server with a certificate the test makes (REDIS-1, REDIS-8)."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import pytest

from kvproto.errors import ConfigurationError

redis_tier = pytest.importorskip("kvproto_redis", reason="kvproto-redis is not installed: pip install -e impls/redis")
from kvproto_redis import LocalRedis, RedisTier  # noqa: E402 (after importorskip)
from tests.impls._tier_runner import key, make_buffer, shut_down_after  # noqa: E402
from tests.impls.redis._support import config_for, open_tier  # noqa: E402

_ACL_USER = ["kv", "on", ">kv-pass", "~kv-acl:*", "&*", "+@all"]  # may touch only keys under kv-acl:


def test_password_and_acl_user_are_sent_and_refusals_fail_at_construction(local_redis: type[LocalRedis]) -> None:
    with local_redis(args=["--requirepass", "s3cret", "--user", *_ACL_USER], password="s3cret") as server:
        with shut_down_after(open_tier(config_for(server, password="s3cret"))) as (_, run):  # the default user
            assert run.store([key(1)]).success
        acl = config_for(server, username="kv", password="kv-pass", prefix="kv-acl")
        with shut_down_after(open_tier(acl)) as (_, run):
            assert run.store([key(1)]).success
            result, right, _ = run.load([key(1)])
            assert result.success and right == {key(1)}
        with pytest.raises(ConfigurationError, match="NoPermissionError") as outside:
            RedisTier(make_buffer(), acl.model_copy(update={"prefix": "elsewhere"}))  # the user may not write there
        with pytest.raises(ConfigurationError, match="(?i)auth|password") as wrong:
            RedisTier(make_buffer(), config_for(server, password="wrong-pass"))
        with pytest.raises(ConfigurationError, match="(?i)auth"):
            RedisTier(make_buffer(), config_for(server))  # no password at all
        for refused in (outside, wrong):
            assert "kv-pass" not in str(refused.value) and "wrong-pass" not in str(refused.value)


def _self_signed(folder: Path) -> dict[str, str]:
    """A self-signed certificate for 127.0.0.1 (EC P-256, one day), its key, and itself as the CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(private.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(private, hashes.SHA256())
    )
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ))
    return {"cert": str(folder / "cert.pem"), "key": str(folder / "key.pem"), "ca": str(folder / "cert.pem")}


def test_tls_round_trip_and_an_untrusted_or_plain_connection_fails_at_construction(
    tmp_path: Path, local_redis: type[LocalRedis]
) -> None:
    pytest.importorskip("cryptography", reason="the test makes its certificate with cryptography (./dev installs it)")
    files = _self_signed(tmp_path)
    with local_redis(tls=files) as server:
        assert server.url.startswith("rediss://")
        config = config_for(server, tls_ca_file=files["ca"])
        assert config.uses_tls
        with shut_down_after(open_tier(config)) as (_, run):
            assert run.store([key(1), key(2)]).success
            result, right, wrong = run.load([key(1), key(2)])
            assert result.success and right == {key(1), key(2)} and not wrong
        with pytest.raises(ConfigurationError, match="(?i)certificate|ssl"):
            RedisTier(make_buffer(), config_for(server))  # the system's CAs do not trust it
        unchecked = config_for(server, tls_verify=False)
        with shut_down_after(open_tier(unchecked)) as (_, run):
            assert run.store([key(3)]).success
        with pytest.raises(ConfigurationError, match=str(server.port)):
            RedisTier(make_buffer(), config_for(server, url=f"redis://127.0.0.1:{server.port}/0", retries=0))
