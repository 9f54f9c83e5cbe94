"""Who may do what on the HTTP listener: static tokens of the policy file, JWT (HS256 and
RS256), the policy's topic permissions, CORS."""

from __future__ import annotations

import hashlib
import time

import jwt
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.http.helpers import H11Client, http_server

READER_TOKEN = "reader-token-0123456789"
WRITER_TOKEN = "writer-token-0123456789"
POLICY = f"""
default = "deny"

[[token]]
user = "reader"
token = "{READER_TOKEN}"

[[token]]
user = "writer"
sha256 = "{hashlib.sha256(WRITER_TOKEN.encode()).hexdigest()}"

[[rule]]
who = ["user:writer"]
topics = "news"
allow = ["publish", "create", "subscribe"]

[[rule]]
who = ["user:reader", "user:jwt-alice"]
topics = "news"
allow = ["subscribe"]
"""


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


async def test_static_tokens_map_to_users_the_policy_names(tmp_path):
    policy = tmp_path / "access.toml"
    policy.write_text(POLICY)
    async with http_server(tmp_path, policy_file=policy) as server:
        client = await H11Client.connect(server.host, server.port)
        # Without a token: the policy refuses listener:http, a token could help (401).
        status, headers, body = await client.request("POST", "/topics/news", b"x")
        assert status == 401 and body["error"] == "unauthorized"
        assert headers["www-authenticate"] == 'Bearer realm="figtank"'
        status, headers, body = await client.request("POST", "/topics/news", b"x",
                                                     bearer(READER_TOKEN))
        assert status == 403 and body["error"] == "access_denied"
        assert headers["www-authenticate"] == 'Bearer realm="figtank", error="insufficient_scope"'
        status, _, body = await client.request("POST", "/topics/news", b"first",
                                               bearer(WRITER_TOKEN))
        assert status == 200, body
        status, _, body = await client.request("GET", "/topics/news/partitions/0/messages",
                                               headers=bearer(READER_TOKEN))
        assert status == 200 and body["messages"][0]["value"] == "first"
        status, headers, body = await client.request("GET", "/topics", headers=bearer(
            "not-a-token-at-all"))
        assert status == 401 and body["error"] == "invalid_token"
        assert headers["www-authenticate"].startswith(
            'Bearer realm="figtank", error="invalid_token", error_description="')
        # EventSource can not send headers: the token may come in the query.
        status, _, _ = await client.request(
            "GET", f"/topics/news/partitions/0/messages?access_token={READER_TOKEN}")
        assert status == 200
        assert server.metric('figtank_access_denied_total{listener="http",'
                             'operation="publish"}') == 2


async def test_jwt_hs256_and_rs256_tokens(tmp_path):
    policy = tmp_path / "access.toml"
    policy.write_text(POLICY)
    secret = tmp_path / "hs256.key"
    secret.write_text("a-shared-secret-of-32-bytes-or-more!!")
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = tmp_path / "rs256.pem"
    public.write_bytes(private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    async with http_server(tmp_path, policy_file=policy,
                           http_jwt_hs256_secret_file=str(secret),
                           http_jwt_rs256_public_key_file=str(public),
                           http_jwt_audience="figtank") as server:
        client = await H11Client.connect(server.host, server.port)
        writer = jwt.encode({"sub": "writer", "aud": "figtank", "exp": time.time() + 60},
                            secret.read_text(), algorithm="HS256")
        status, _, body = await client.request("POST", "/topics/news", b"hs", bearer(writer))
        assert status == 200, body
        alice = jwt.encode({"sub": "jwt-alice", "aud": "figtank",
                            "exp": time.time() + 60}, private, algorithm="RS256")
        status, _, body = await client.request("GET", "/topics/news/partitions/0/messages",
                                               headers=bearer(alice))
        assert status == 200 and body["messages"][0]["value"] == "hs"
        status, _, _ = await client.request("POST", "/topics/news", b"no", bearer(alice))
        assert status == 403
        for bad in (
                jwt.encode({"sub": "writer", "aud": "figtank", "exp": time.time() - 5},
                           secret.read_text(), algorithm="HS256"),  # expired
                jwt.encode({"sub": "writer", "aud": "other"}, secret.read_text(),
                           algorithm="HS256"),  # wrong audience
                jwt.encode({"sub": "writer", "aud": "figtank"},
                           "another-secret-entirely-of-32-bytes!!", algorithm="HS256"),  # key
        ):
            status, _, body = await client.request("POST", "/topics/news", b"x", bearer(bad))
            assert status == 401 and body["error"] == "invalid_token", body


async def test_cors_origins(tmp_path):
    async with http_server(tmp_path, http_cors_origins=("https://app.example",)) as server:
        client = await H11Client.connect(server.host, server.port)
        status, headers, _ = await client.request("GET", "/topics", headers=[
            ("origin", "https://app.example")])
        assert status == 200
        assert headers["access-control-allow-origin"] == "https://app.example"
        status, headers, _ = await client.request("GET", "/topics", headers=[
            ("origin", "https://evil.example")])
        assert status == 200 and "access-control-allow-origin" not in headers
        status, headers, _ = await client.request("OPTIONS", "/topics/t", headers=[
            ("origin", "https://app.example"), ("access-control-request-method", "POST")])
        assert status == 204 and "POST" in headers["access-control-allow-methods"]
        status, _, body = await client.request("OPTIONS", "/topics/t", headers=[
            ("origin", "https://evil.example"), ("access-control-request-method", "POST")])
        assert status == 403 and body["error"] == "origin_not_allowed"
        status, _, body = await client.request("GET", "/ws", headers=[
            ("origin", "https://evil.example"), ("upgrade", "websocket"),
            ("connection", "Upgrade"), ("sec-websocket-version", "13"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")])
        assert status == 403 and body["error"] == "origin_not_allowed"
        # The preflight allows every request header the docs name, echoing those asked.
        status, headers, _ = await client.request("OPTIONS", "/topics/t", headers=[
            ("origin", "https://app.example"), ("access-control-request-method", "POST"),
            ("access-control-request-headers", "figtank-key-base64,content-type,x-other")])
        assert status == 204
        assert headers["access-control-allow-headers"] == "figtank-key-base64, content-type"
        status, headers, _ = await client.request("OPTIONS", "/topics/t", headers=[
            ("origin", "https://app.example"), ("access-control-request-method", "POST")])
        assert set(headers["access-control-allow-headers"].split(", ")) == {
            "authorization", "content-type", "figtank-key", "figtank-key-base64",
            "last-event-id"}
        await client.aclose()


async def test_a_bytes_in_quota_holds_producers_back(tmp_path):
    policy = tmp_path / "access.toml"
    policy.write_text('[[quota]]\nwho = ["listener:http"]\nbytes_in_per_sec = 200000\n'
                      'burst_bytes_in = 200000\n')
    async with http_server(tmp_path, policy_file=policy) as server:
        client = await H11Client.connect(server.host, server.port)
        started = trio.current_time()
        for _ in range(10):  # 500 KB: 300 KB over the burst, at 200 KB/s
            status, _, _ = await client.request("POST", "/topics/q", b"x" * 50_000)
            assert status == 200
        assert trio.current_time() - started >= 1.0
        assert (server.metric('figtank_quota_delay_seconds_total{direction="in"}') or 0) > 0.5
        await client.aclose()


async def test_the_console_data_follows_the_access_policy(tmp_path):
    policy = tmp_path / "access.toml"
    policy.write_text(POLICY)
    async with http_server(tmp_path, policy_file=policy) as server:
        client = await H11Client.connect(server.host, server.port)
        status, _, _ = await client.request("POST", "/topics/news", b"n", bearer(WRITER_TOKEN))
        assert status == 200
        # listener:http is granted nothing and the listener takes tokens: a challenge.
        status, headers, body = await client.request("GET", "/api/overview")
        assert status == 401 and headers["www-authenticate"] == 'Bearer realm="figtank"'
        status, _, body = await client.request("GET", "/api/overview",
                                               headers=bearer(READER_TOKEN))
        assert [t["name"] for t in body["topics"]] == ["news"]
        assert body["topics"][0]["partitions"] == [
            {"partition": 0, "first_offset": 1, "last_offset": 1}]
        status, _, body = await client.request("GET", "/topics/news/events",
                                               headers=bearer("nope-not-a-token"))
        assert status == 401
        await client.aclose()
