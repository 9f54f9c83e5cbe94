"""SASL on the Kafka listener, request by request (issue 17, "Access"): what a SASL
listener answers before authentication, unknown mechanisms, malformed
SCRAM messages (a clear error and a closed connection, never a traceback), the
authentication deadline, SIGHUP-reloaded users and the SASL user's quota."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import trio
from structlog.testing import capture_logs

import protocols.kafka.records as r
from gateway.auth.users import user_entry
from protocols.kafka.types import ApiKey, ErrorCode
from tests.kafka.helpers import kafka_server
from tests.kafka.raw import call, read_frame, request
from tests.kafka.sasl_helpers import PASSWORDS, RULES, failures, policy_text, sasl_server
from tests.kafka.scram_client import ScramClient
from tests.serving import figtank_serve

HANDSHAKE = ApiKey.SASL_HANDSHAKE
AUTHENTICATE = ApiKey.SASL_AUTHENTICATE


async def connect(server: Any, listener: str = "kafka") -> trio.SocketStream:
    return await trio.open_tcp_stream(*server.addresses[listener])


async def handshake(stream: trio.SocketStream, mechanism: str, version: int = 1) -> Any:
    return (await call(stream, HANDSHAKE, version, r.SaslHandshakeRequest(mechanism)))[1]


async def authenticate(stream: trio.SocketStream, token: bytes, version: int = 2) -> Any:
    return (await call(stream, AUTHENTICATE, version, r.SaslAuthenticateRequest(token)))[1]


async def closed(stream: trio.SocketStream) -> bool:
    with trio.fail_after(5):
        return await read_frame(stream) is None


async def scram_login(stream: trio.SocketStream, mechanism: str, user: str,
                      password: str) -> Any:
    client = ScramClient(mechanism, user, password)
    assert (await handshake(stream, mechanism)).error_code == 0
    first = await authenticate(stream, client.first())
    assert first.error_code == 0, first.error_message
    final = await authenticate(stream, client.final(first.auth_bytes))
    if final.error_code == 0:
        assert client.verify(final.auth_bytes)  # the server knows the credential
    return final


def metadata(topic: str) -> r.MetadataRequest:
    return r.MetadataRequest(topics=[r.MetadataRequestTopic(name=topic)])


def no_tracebacks(logs: list[dict[str, Any]]) -> None:
    assert not [e for e in logs if e.get("exc_info") or e["event"] == "kafka_request_failed"]


async def test_only_api_versions_and_sasl_before_authentication(tmp_path: Path) -> None:
    with capture_logs() as logs:
        async with sasl_server(tmp_path) as server:
            with trio.fail_after(10):
                stream = await connect(server)
                _, versions = await call(stream, ApiKey.API_VERSIONS, 3,
                                         r.ApiVersionsRequest("t", "1"))
                await stream.send_all(request(ApiKey.METADATA, 9, 2, metadata("t")))
                assert await closed(stream)
    served = {v.api_key: (v.min_version, v.max_version) for v in versions.api_keys}
    assert served[HANDSHAKE] == (0, 1) and served[AUTHENTICATE] == (0, 2)
    close = [e for e in logs if e["event"] == "connection_closed"]
    assert close and close[0]["kind"] == "sasl_required"
    assert "metadata before SASL authentication" in close[0]["reason"]


async def test_a_scram_login_then_requests_are_served(tmp_path: Path) -> None:
    async with sasl_server(tmp_path) as server:
        with trio.fail_after(10):
            stream = await connect(server)
            final = await scram_login(stream, "SCRAM-SHA-512", "alice", PASSWORDS["alice"])
            _, meta = await call(stream, ApiKey.METADATA, 9, metadata("t"), 3)
            again = await handshake(stream, "PLAIN")  # no re-authentication
            _, still = await call(stream, ApiKey.METADATA, 9, metadata("t"), 5)
            quota_user = server.quotas.get("user:alice")
    assert final.error_code == 0 and final.session_lifetime_ms == 0
    assert meta.topics[0].name == "t" and still.topics[0].name == "t"
    assert again.error_code == ErrorCode.ILLEGAL_SASL_STATE
    assert quota_user is not None  # the user's quota buckets, not the listener's


async def test_unknown_mechanisms_are_refused(tmp_path: Path) -> None:
    async with sasl_server(tmp_path, mechanisms=("SCRAM-SHA-256",)) as server:
        with trio.fail_after(10):
            gssapi = await connect(server)
            refused = await handshake(gssapi, "GSSAPI")
            assert await closed(gssapi)
            plain = await connect(server)
            not_enabled = await handshake(plain, "PLAIN")
            assert await closed(plain)
            old = await connect(server)  # version 0 too
            v0 = await handshake(old, "PLAIN", version=0)
            assert await closed(old)
            assert failures(server, "kafka", "unsupported") == 3
    assert (refused.error_code, refused.mechanisms) == (
        ErrorCode.UNSUPPORTED_SASL_MECHANISM, ["SCRAM-SHA-256"])
    assert not_enabled.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert (v0.error_code, v0.mechanisms) == (
        ErrorCode.UNSUPPORTED_SASL_MECHANISM, ["SCRAM-SHA-256"])


MALFORMED_FIRST = [
    (b"", "malformed client-first"),
    (b"n,,r=abc", "malformed client-first"),
    (b"p=tls-unique,,n=alice,r=abc", "channel binding is not supported"),
    (b"x,,n=alice,r=abc", "gs2 flag"),
    (b"n,,n=al=ice,r=abc", "malformed user name"),
    (b"n,,n=alice,r=", "malformed client nonce"),
    (b"n,,n=alice,r=abc,m=ext", "mandatory extensions"),
    (b"n,a=bob,n=alice,r=abc", "authorization id"),
    (b"\xff\xfe", "not UTF-8"),
]


@pytest.mark.parametrize(("token", "says"), MALFORMED_FIRST)
async def test_malformed_client_first_is_a_clear_failure(tmp_path: Path, token: bytes,
                                                         says: str) -> None:
    with capture_logs() as logs:
        async with sasl_server(tmp_path) as server:
            with trio.fail_after(10):
                stream = await connect(server)
                assert (await handshake(stream, "SCRAM-SHA-256")).error_code == 0
                answer = await authenticate(stream, token)
                assert await closed(stream)
                assert failures(server, "kafka", "SCRAM-SHA-256") == 1
    assert answer.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert says in answer.error_message
    logged = [e for e in logs if e["event"] == "sasl_auth_failed"]
    assert len(logged) == 1 and says in logged[0]["reason"]
    no_tracebacks(logs)


def tamper(final: bytes, how: str) -> bytes:
    c, nonce, proof = final.split(b",")
    if how == "nonce":
        return b",".join((c, nonce + b"x", proof))
    if how == "base64":
        return b",".join((c, nonce, b"p=!!!"))
    if how == "short proof":
        return b",".join((c, nonce, b"p=AAAA"))
    if how == "binding":
        return b",".join((b"c=eSws", nonce, proof))
    return b"c=biws"


@pytest.mark.parametrize(("how", "says"), [
    ("nonce", "nonce does not match"), ("base64", "base64"),
    ("short proof", "wrong length"), ("binding", "channel binding data"),
    ("truncated", "malformed client-final")])
async def test_malformed_client_final_is_a_clear_failure(tmp_path: Path, how: str,
                                                         says: str) -> None:
    with capture_logs() as logs:
        async with sasl_server(tmp_path) as server:
            with trio.fail_after(10):
                stream = await connect(server)
                client = ScramClient("SCRAM-SHA-256", "alice", PASSWORDS["alice"])
                await handshake(stream, "SCRAM-SHA-256")
                first = await authenticate(stream, client.first(), version=0)
                answer = await authenticate(stream, tamper(client.final(first.auth_bytes),
                                                           how), version=0)
                assert await closed(stream)
    assert answer.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert says in answer.error_message
    no_tracebacks(logs)


async def test_wrong_password_and_unknown_user_look_alike(tmp_path: Path) -> None:
    async with sasl_server(tmp_path) as server:
        with trio.fail_after(10):
            answers = []
            for user, password in (("alice", "nope"), ("nobody", "nope")):
                stream = await connect(server)
                answers.append(await scram_login(stream, "SCRAM-SHA-256", user, password))
                assert await closed(stream)
            plain = []
            for token in (b"\0alice\0nope", b"\0nobody\0nope", b"alice\0nope"):
                stream = await connect(server)
                await handshake(stream, "PLAIN")
                plain.append(await authenticate(stream, token))
                assert await closed(stream)
    assert {(a.error_code, a.error_message) for a in answers} == {
        (ErrorCode.SASL_AUTHENTICATION_FAILED, "Authentication failed during authentication "
         "due to invalid credentials with SASL mechanism SCRAM-SHA-256")}
    assert plain[0].error_message == plain[1].error_message == (
        "Authentication failed: Invalid username or password")
    assert "malformed token" in plain[2].error_message


async def test_authenticate_before_handshake_and_the_deadline(tmp_path: Path) -> None:
    async with sasl_server(tmp_path, sasl_timeout_secs=0.3) as server:
        with trio.fail_after(10):
            early = await connect(server)
            answer = await authenticate(early, b"\0alice\0x")
            assert await closed(early)
            slow = await connect(server)
            await handshake(slow, "SCRAM-SHA-256")
            start = trio.current_time()
            assert await closed(slow)
            waited = trio.current_time() - start
            assert failures(server, "kafka", "SCRAM-SHA-256") == 1  # the deadline
            assert failures(server, "kafka", "none") == 1
    assert answer.error_code == ErrorCode.ILLEGAL_SASL_STATE
    assert 0.1 < waited < 2


async def test_a_listener_without_sasl_answers_illegal_sasl_state(tmp_path: Path) -> None:
    async with kafka_server(tmp_path) as server:
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream(*server.kafka)
            hs = await handshake(stream, "PLAIN")
            auth = await authenticate(stream, b"\0alice\0x")
            _, meta = await call(stream, ApiKey.METADATA, 9, metadata("t"), 3)
    assert hs.error_code == auth.error_code == ErrorCode.ILLEGAL_SASL_STATE
    assert meta.topics[0].name == "t"  # the connection goes on


async def test_reload_changes_the_users(tmp_path: Path) -> None:
    async with sasl_server(tmp_path) as server:
        with trio.fail_after(15):
            stream = await connect(server)
            assert (await scram_login(stream, "SCRAM-SHA-256", "carol", "c")).error_code
            (tmp_path / "access.toml").write_text(policy_text({"carol": "c"}))
            assert server.reload()
            carol = await connect(server)
            assert (await scram_login(carol, "SCRAM-SHA-256", "carol", "c")).error_code == 0
            alice = await connect(server)
            gone = await scram_login(alice, "SCRAM-SHA-256", "alice", PASSWORDS["alice"])
            (tmp_path / "access.toml").write_text(RULES + "[[user]]\nname = \"x\"\n")
            assert not server.reload()  # a bad file keeps the users in force
            again = await connect(server)
            assert (await scram_login(again, "SCRAM-SHA-256", "carol", "c")).error_code == 0
    assert gone.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED


async def test_plain_login_over_raw_requests(tmp_path: Path) -> None:
    entry = user_entry("dave", "pw", ["SCRAM-SHA-512"])  # PLAIN checks the -512 one
    (tmp_path / "access.toml").write_text(RULES + "\n" + entry)
    async with sasl_server(tmp_path) as server:
        with trio.fail_after(10):
            stream = await connect(server)
            await handshake(stream, "PLAIN")
            ok = await authenticate(stream, b"dave\0dave\0pw", version=1)
            _, meta = await call(stream, ApiKey.METADATA, 9, metadata("t"), 3)
    assert (ok.error_code, ok.auth_bytes) == (0, b"")
    assert meta.topics[0].name == "t"


async def test_sighup_reloads_the_users_of_a_serve_process(tmp_path: Path) -> None:
    policy = tmp_path / "access.toml"
    policy.write_text(policy_text())
    config = tmp_path / "figtank.toml"
    config.write_text(f"""
[listen]
tank = ""
figg = ""
metrics = ""
[auth]
policy_file = "{policy}"
[listeners.kafka]
sasl_mechanisms = ["SCRAM-SHA-256"]
""")
    with figtank_serve("--config", str(config), "--data-dir", str(tmp_path / "data"),
                       "--durability", "os", "--kafka-listen", "127.0.0.1:0") as server:
        [serving] = server.events("figtank_serving")
        host, _, port = serving["kafka"].rpartition(":")
        with trio.fail_after(20):
            before = await trio.open_tcp_stream(host, int(port))
            refused = await scram_login(before, "SCRAM-SHA-256", "carol", "c")
            policy.write_text(policy_text({"carol": "c"}))
            server.process.send_signal(signal.SIGHUP)
            while not server.events("reloaded"):
                await trio.sleep(0.05)
            after = await trio.open_tcp_stream(host, int(port))
            ok = await scram_login(after, "SCRAM-SHA-256", "carol", "c")
            _, meta = await call(after, ApiKey.METADATA, 9, metadata("t"), 3)
            await after.aclose()
        assert server.stop() == 0
    assert refused.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert ok.error_code == 0 and meta.topics[0].name == "t"
    assert [e["user"] for e in server.events("sasl_auth_failed")] == ["carol"]
