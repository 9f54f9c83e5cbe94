"""Bearer challenges (RFC 6750 §3) on every endpoint: no token where one could help is 401
``Bearer realm="figtank"``; a bad or expired token 401 ``error="invalid_token"``; a valid
token without the permission 403 ``error="insufficient_scope"``; with no token mechanism
a refusal stays a plain 403. Over h11 and ``curl -i``."""

from __future__ import annotations

import json
import time

import jwt
import trio

from tests.http.access_helpers import OTHER, READER, WRITER, policy
from tests.http.helpers import H11Client, curl_i, http_server

REALM = 'Bearer realm="figtank"'
SCOPE = 'Bearer realm="figtank", error="insufficient_scope"'
INVALID = 'Bearer realm="figtank", error="invalid_token", error_description="'
SECRET = "a-shared-secret-of-32-bytes-or-more!!"
NOBODY = "nobody-token-0123456789"
WS = [("upgrade", "websocket"), ("connection", "Upgrade"), ("sec-websocket-version", "13"),
      ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")]
#: Every endpoint behind the policy: (method, target, headers, body).
ENDPOINTS = [
    ("POST", "/topics/news", [], b"x"),
    ("GET", "/topics/news/partitions/0/messages", [], b""),
    ("GET", "/topics/news/events?from=earliest", [], b""),
    ("GET", "/topics", [], b""),
    ("GET", "/topics/news", [], b""),
    ("GET", "/api/overview", [], b""),
    ("GET", "/ws", WS, b""),
    ("GET", "/ws", [], b""),  # the probe
]


def _policy_with_nobody() -> str:
    # user:nobody has a valid token and no rule: granted nothing at all.
    return policy('["news"]') + f'[[token]]\nuser = "nobody"\ntoken = "{NOBODY}"\n'


def _bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


async def _request(server, method: str, target: str, headers: list[tuple[str, str]],
                   body: bytes = b"") -> tuple[int, dict[str, str], dict]:
    """One request on its own connection (a refused upgrade or an SSE stream would keep
    a shared one busy)."""
    with trio.fail_after(10):
        client = await H11Client.connect(server.host, server.port)
        try:
            await client.send(method, target, body, headers)
            head = await client.next_event()
            got = {k.decode(): v.decode() for k, v in head.headers}
            raw = b""
            if head.status_code >= 400:  # a refusal: its JSON body (a stream's is not read)
                while True:
                    event = await client.next_event()
                    if not hasattr(event, "data"):
                        break
                    raw += event.data
            return head.status_code, got, json.loads(raw) if raw else {}
        finally:
            await client.aclose()


async def test_challenges_on_every_endpoint(tmp_path):
    access = tmp_path / "access.toml"
    access.write_text(_policy_with_nobody())
    secret = tmp_path / "hs256.key"
    secret.write_text(SECRET)
    async with http_server(tmp_path, policy_file=access,
                           http_jwt_hs256_secret_file=str(secret)) as server:
        client = await H11Client.connect(server.host, server.port)
        status, _, body = await client.request("POST", "/topics/news", b"n", _bearer(WRITER))
        assert status == 200, body
        await client.aclose()
        expired = jwt.encode({"sub": "writer", "exp": time.time() - 5}, SECRET,
                             algorithm="HS256")
        for method, target, headers, body in ENDPOINTS:
            where = (method, target, bool(headers))
            # No credentials: the policy refuses listener:http; a token could help.
            status, got, answer = await _request(server, method, target, headers, body)
            assert status == 401 and got["www-authenticate"] == REALM, (where, answer)
            assert answer["error"] == "unauthorized", where
            # Another scheme is no Bearer credential.
            status, got, _ = await _request(server, method, target,
                                            [*headers, ("authorization", "Basic dTpw")], body)
            assert status == 401 and got["www-authenticate"] == REALM, where
            # A token that is not valid, in the header or in the query; an expired JWT.
            for bad_headers, bad_target, why in (
                    (_bearer("not-a-token-at-all"), target, "not valid"),
                    ([], f"{target}{'&' if '?' in target else '?'}access_token=nope-nope",
                     "not valid"),
                    (_bearer(expired), target, "expired")):
                status, got, answer = await _request(server, method, bad_target,
                                                     [*headers, *bad_headers], body)
                assert status == 401 and answer["error"] == "invalid_token", where
                assert got["www-authenticate"].startswith(INVALID), where
                assert why in got["www-authenticate"] and got["www-authenticate"].endswith(
                    '"'), got["www-authenticate"]
            # A valid token granted nothing: 403 with insufficient_scope.
            status, got, answer = await _request(server, method, target,
                                                 [*headers, *_bearer(NOBODY)], body)
            assert status == 403 and got["www-authenticate"] == SCOPE, (where, answer)
            assert answer["error"] == "access_denied"
        # A valid token granted something, but not this: the reader may not produce.
        status, got, answer = await _request(server, "POST", "/topics/news", _bearer(READER),
                                             b"x")
        assert (status, answer["error"], got["www-authenticate"]) == (403, "access_denied",
                                                                      SCOPE)
        # And where it is granted: served (the probe then says the upgrade is missing).
        for method, target, headers, body, expected in (
                ("GET", "/topics/news/partitions/0/messages", [], b"", 200),
                ("GET", "/api/overview", [], b"", 200),
                ("GET", "/ws", WS, b"", 101),
                ("GET", "/ws", [], b"", 400)):
            status, got, answer = await _request(server, method, target,
                                                 [*headers, *_bearer(OTHER)], body)
            assert status == expected and "www-authenticate" not in got, (target, answer)
        status, _, answer = await _request(server, "GET", "/ws", _bearer(OTHER))
        assert answer["error"] == "bad_upgrade"


async def test_without_tokens_a_refusal_stays_403(tmp_path):
    access = tmp_path / "access.toml"
    access.write_text('default = "deny"\n[[rule]]\nwho = ["listener:other"]\n'
                      'topics = "*"\nallow = ["publish"]\n')
    async with http_server(tmp_path, policy_file=access) as server:
        for method, target, headers, body in ENDPOINTS:
            status, got, answer = await _request(server, method, target, headers, body)
            assert status == 403 and answer["error"] == "access_denied", (target, answer)
            assert "www-authenticate" not in got


async def test_a_principal_granted_something_is_served_and_challenged_elsewhere(tmp_path):
    access = tmp_path / "access.toml"
    access.write_text(policy('["news"]') + '[[rule]]\nwho = ["listener:http"]\n'
                      'topics = "public"\nallow = ["subscribe"]\n')
    async with http_server(tmp_path, policy_file=access) as server:
        for topic in ("public", "news"):
            status, _, _ = await _request(server, "POST", f"/topics/{topic}", _bearer(WRITER),
                                          b"m")
            assert status == 200
        status, _, _ = await _request(server, "GET", "/topics/public/partitions/0/messages",
                                      [])
        assert status == 200
        status, _, _ = await _request(server, "GET", "/api/overview", [])
        assert status == 200
        status, got, _ = await _request(server, "GET", "/topics/news/partitions/0/messages",
                                        [])
        assert status == 401 and got["www-authenticate"] == REALM
        status, got, _ = await _request(server, "POST", "/topics/public", [], b"x")
        assert status == 401 and got["www-authenticate"] == REALM


async def _curl_i(*args: str) -> tuple[int, dict[str, str], dict]:
    """``curl -i`` (the URL last): status, headers and the JSON body."""
    *options, url = args
    answer = await curl_i(url, *options)
    return answer.status, answer.headers, answer.json() if answer.body.strip() else {}


async def test_curl_sees_the_challenges(tmp_path):
    access = tmp_path / "access.toml"
    access.write_text(_policy_with_nobody())
    async with http_server(tmp_path, policy_file=access) as server:
        base = f"http://{server.host}:{server.port}"
        status, _, _ = await _curl_i("-X", "POST", "-H", f"Authorization: Bearer {WRITER}",
                                     "--data-binary", "n", f"{base}/topics/news")
        assert status == 200
        status, headers, body = await _curl_i("-X", "POST", "--data-binary", "x",
                                              f"{base}/topics/news")
        assert (status, headers["www-authenticate"], body["error"]) == (401, REALM,
                                                                        "unauthorized")
        status, headers, body = await _curl_i("-H", "Authorization: Bearer wrong-token",
                                              f"{base}/topics/news/events")
        assert status == 401 and body["error"] == "invalid_token"
        assert headers["www-authenticate"] == (
            INVALID + 'the bearer token is not valid here"')
        status, headers, body = await _curl_i("-X", "POST", "-H",
                                              f"Authorization: Bearer {READER}",
                                              "--data-binary", "x", f"{base}/topics/news")
        assert (status, headers["www-authenticate"], body["error"]) == (403, SCOPE,
                                                                        "access_denied")
        status, headers, body = await _curl_i(f"{base}/ws")  # the probe, no credentials
        assert (status, headers["www-authenticate"]) == (401, REALM)
        status, headers, body = await _curl_i("-H", f"Authorization: Bearer {OTHER}",
                                              f"{base}/ws")
        assert (status, body["error"]) == (400, "bad_upgrade")
        status, headers, body = await _curl_i(f"{base}/ws?access_token={NOBODY}")
        assert (status, headers["www-authenticate"]) == (403, SCOPE)
