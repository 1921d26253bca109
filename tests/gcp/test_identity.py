"""Instance identity tokens: the JWT checks on their own (a key of the test's own stands for Google's), then the
provider's: which instance of the group a token proves, against the fake server's list."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.providers.gcp_identity import parse_keys, verify
from controller.providers.identity import IdentityNotOffered, IdentityRefused, IdentityUnavailable
from tests.gcp.fake_identity import FakeGoogle, b64, new_key
from tests.gcp.harness import GROUP, Harness, run

AUDIENCE = "spotmorph/spotmorph-test/us-central1-a/spot"


def check(google: FakeGoogle, token: str, audience: str = AUDIENCE) -> Any:
    return verify(token, google.key.public_key(), audience, time.time())


def test_a_valid_token_names_its_instance(google: FakeGoogle) -> None:
    proven = check(google, google.token(AUDIENCE, "spot-0001", "4000000000000000007"))
    assert (proven.project, proven.zone) == ("spotmorph-test", "us-central1-a")
    assert (proven.instance_name, proven.instance_id) == ("spot-0001", "4000000000000000007")
    listed = google.token("other", "spot-0001", "7", claims={"aud": ["other", AUDIENCE]})
    assert check(google, listed).instance_name == "spot-0001"  # aud may be a list naming ours


@pytest.mark.parametrize(
    ("forgery", "says"),
    [
        ({"key": "other"}, "signature is not Google's"),
        ({"issued": -7200}, "expired"),
        ({"audience": "spotmorph/another/cluster"}, "another audience"),
        ({"issued": 3600}, "in the future"),
        ({"claims": {"iss": "https://evil.example"}}, "not issued by Google"),
        ({"claims": {"google": {}}}, "format=full"),
        ({"claims": {"exp": "tomorrow"}}, "exp is not a time"),
        ({"claims": {"exp": True}}, "exp is not a time"),
        ({"header": {"alg": "none"}}, "not RS256"),
        ({"header": {"alg": "HS256"}}, "not RS256"),
        ({"claims": {"google": {"compute_engine": {"instance_id": 7, "instance_name": "a"}}}}, "lacks project_id"),
    ],
)
def test_forged_expired_and_misaddressed_tokens_are_refused(
    google: FakeGoogle, forgery: dict[str, Any], says: str
) -> None:
    arguments = {**forgery}
    audience = arguments.pop("audience", AUDIENCE)
    if arguments.get("key") == "other":
        arguments["key"] = new_key()  # anyone's key but Google's
    if "issued" in arguments:
        arguments["issued"] += time.time()
    token = google.token(audience, "spot-0001", "7", **arguments)
    with pytest.raises(IdentityRefused, match=says):
        check(google, token)


def test_a_token_altered_after_signing_is_refused(google: FakeGoogle) -> None:
    header, claims, signature = google.token(AUDIENCE, "spot-0001", "7").split(".")
    document = json.loads(base64.urlsafe_b64decode(claims + "=="))
    document["google"]["compute_engine"]["instance_name"] = "spot-0002"  # another VM's name, same signature
    altered = b64(json.dumps(document).encode())
    with pytest.raises(IdentityRefused, match="signature"):
        check(google, f"{header}.{altered}.{signature}")


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=300), st.lists(st.text(max_size=80), min_size=3, max_size=3).map(".".join)))
def test_any_string_is_refused_never_a_crash(google: FakeGoogle, junk: str) -> None:
    with pytest.raises(IdentityRefused):
        check(google, junk)


@settings(max_examples=100, deadline=None)
@given(header=st.dictionaries(st.text(max_size=5), st.none() | st.integers() | st.text(max_size=5), max_size=3))
def test_any_header_is_refused_never_a_crash(google: FakeGoogle, header: dict[str, Any]) -> None:
    head = b64(json.dumps(header).encode())
    with pytest.raises(IdentityRefused):
        check(google, f"{head}.{b64(b'{}')}.{b64(b'sig')}")


def test_keys_come_as_jwks_a_map_of_certificates_or_pem(google: FakeGoogle) -> None:
    public = google.key.public_key().public_numbers()
    for document in (
        json.dumps(google.jwks()).encode(),
        json.dumps({google.kid: google.certificate_pem()}).encode(),
    ):
        assert parse_keys(document)[google.kid].public_numbers() == public
    pem = google.key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert parse_keys(pem)[""].public_numbers() == public
    for junk in (
        b"[]",
        b"{}",
        b'{"keys": [{"kty": "EC", "kid": "x"}]}',
        b'{"keys": [{"kty": "RSA", "kid": "x", "n": 5}]}',
    ):
        with pytest.raises(ValueError):
            parse_keys(junk)


def test_the_provider_proves_instances_of_its_group_only() -> None:
    async def scenario(h: Harness) -> None:
        first, second = h.fake.running(GROUP)
        provider = h.provider(target_capacity=2)
        await provider.list_instances()
        assert await provider.verify_identity(h.fake.identity_token(first, AUDIENCE)) == first
        elsewhere = h.fake.google.token(AUDIENCE, first, h.fake.instance(first).id, project="other-project")
        with pytest.raises(IdentityRefused, match="not of spotmorph-test"):
            await provider.verify_identity(elsewhere)
        with pytest.raises(IdentityRefused, match="another audience"):
            await provider.verify_identity(h.fake.identity_token(first, "spotmorph/some/other/cluster"))
        old = h.fake.identity_token(second, AUDIENCE)
        h.fake.preempt(second)  # recreated under its name: a new VM, a new id
        await provider.list_instances()
        await provider.list_instances()
        with pytest.raises(IdentityRefused, match="not \\(or no longer\\) in group"):
            await provider.verify_identity(old)  # the old VM's token, still within its hour
        assert await provider.verify_identity(h.fake.identity_token(second, AUDIENCE)) == second
        assert h.fake.requests.count(("GET", "/oauth2/v3/certs")) == 1  # the keys are kept

    run(scenario, running=2)


def test_a_vm_newer_than_the_last_list_is_looked_up_once_in_a_while() -> None:
    async def scenario(h: Harness) -> None:
        provider = h.provider(target_capacity=1)
        await provider.list_instances()
        (new,) = h.fake.add_group(GROUP, running=1)  # created since the controller last looked
        lists = len(h.fake.requests)
        assert await provider.verify_identity(h.fake.identity_token(new, AUDIENCE)) == new
        assert len(h.fake.requests) > lists
        stranger = h.fake.google.token(AUDIENCE, "spot-beef", "99", project=h.fake.project, zone=h.fake.zone)
        sent = len(h.fake.requests)
        with pytest.raises(IdentityRefused):
            await provider.verify_identity(stranger)
        assert len(h.fake.requests) == sent, "not another list within IDENTITY_RELIST_SECONDS"
        h.clock.advance(5)
        with pytest.raises(IdentityRefused):
            await provider.verify_identity(stranger)
        assert len(h.fake.requests) == sent + 1

    run(scenario, running=1)


def test_keys_from_a_file_and_an_unreachable_key_source(tmp_path: Path) -> None:
    async def scenario(h: Harness) -> None:
        (name,) = h.fake.running(GROUP)
        certificates = tmp_path / "certs.json"
        certificates.write_text(json.dumps({h.fake.google.kid: h.fake.google.certificate_pem()}))
        provider = h.provider(target_capacity=1, identity_certs=str(certificates))
        assert await provider.verify_identity(h.fake.identity_token(name, AUDIENCE)) == name
        cut_off = h.provider(target_capacity=1, identity_certs="http://127.0.0.1:1/certs")
        with pytest.raises(IdentityUnavailable):
            await cut_off.verify_identity(h.fake.identity_token(name, AUDIENCE))
        off = h.provider(target_capacity=1, agent_tokens=False)
        with pytest.raises(IdentityNotOffered, match="agent_tokens is off"):
            await off.verify_identity(h.fake.identity_token(name, AUDIENCE))

    run(scenario, running=1)
