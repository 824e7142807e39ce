"""gateway/auth.py: which API keys a deployment accepts and which one a caller presented."""

from __future__ import annotations

from gateway.auth import parse_keys, presented_key


def test_api_key_parsing():
    assert parse_keys(" a, ,b ,") == ["a", "b"]
    assert presented_key([("authorization", "Bearer  k1 ")]) == "k1"
    assert presented_key([("authorization", "bearer k2")]) == "k2"
    assert presented_key([("x-api-key", "k3")]) == "k3"
    assert presented_key([("authorization", "Basic k4")]) == ""
    assert presented_key(None) == ""


def test_a_tenant_id_is_stable_per_key_and_never_the_key():
    from gateway.auth import tenant_of

    assert tenant_of("key-a") == tenant_of("key-a") != tenant_of("key-b")
    assert "key-a" not in tenant_of("key-a") and len(tenant_of("key-a")) == 16
    assert tenant_of("") == ""  # no key: no tenant
