"""A reload of the access policy or of the JWT keys reaches open SSE streams and
WebSockets: those no longer allowed end (SSE after an ``event: revoked``, WebSocket with
4003), with one log line and one count each; the others go on untouched."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import jwt
import trio
from structlog.testing import capture_logs

from tests.http.access_helpers import OTHER, READER, policy, produce
from tests.http.helpers import H11Client, SseReader, http_server, sse_events
from tests.http.ws_client import WsClient
from tests.serving import figtank_serve


def revoked(logs: list[dict]) -> list[tuple[str, str, str]]:
    return sorted((e["stream"], e["identity"], e["topic"] or "-") for e in logs
                  if e["event"] == "http_stream_revoked")


async def test_a_reload_ends_the_streams_it_no_longer_allows(tmp_path: Path) -> None:
    access = tmp_path / "access.toml"
    access.write_text(policy('["news", "sports"]'))
    with capture_logs() as logs:
        async with http_server(tmp_path, policy_file=access) as server:
            host, port = server.host, server.port
            writer = await H11Client.connect(host, port)
            await produce(writer, "news", "n1")
            await produce(writer, "sports", "s1")
            news = await SseReader.open(host, port, "/topics/news/events?from=earliest"
                                        f"&access_token={READER}")
            sports = await SseReader.open(host, port, "/topics/sports/events?from=earliest"
                                          f"&access_token={READER}")
            others = await SseReader.open(host, port, "/topics/news/events?from=earliest"
                                          f"&access_token={OTHER}")
            ws_news = await WsClient.connect(host, port, f"/ws?access_token={READER}")
            await ws_news.send({"op": "attach", "topic": "news", "from": "earliest"})
            ws_sports = await WsClient.connect(host, port, f"/ws?access_token={READER}")
            await ws_sports.send({"op": "attach", "topic": "sports", "from": "earliest"})
            for stream in (news, sports, others):
                await stream.read_until(lambda s: len(s.values()) == 1)
            assert (await ws_news.until("data"))["value"] == "n1"
            assert (await ws_sports.until("data"))["value"] == "s1"

            assert server.listener.open_streams.recheck() == 0  # nothing changed yet
            access.write_text(policy('["sports"]'))
            assert server_reload(server)
            await news.read_until(lambda s: s.ended)
            [last] = [e for e in sse_events(news.text) if e.get("event") == "revoked"]
            assert json.loads(last["data"])["error"] == "access_revoked"
            assert "may no longer subscribe to 'news'" in json.loads(last["data"])["message"]
            code, reason = await ws_news.wait_closed()
            assert code == 4003 and "news" in reason
            # The others go on, untouched.
            await produce(writer, "news", "n2")
            await produce(writer, "sports", "s2")
            await sports.read_until(lambda s: len(s.values()) == 2)
            await others.read_until(lambda s: len(s.values()) == 2)
            assert sports.values() == ["s1", "s2"] and not sports.ended
            assert others.values() == ["n1", "n2"]
            assert (await ws_sports.until("data"))["value"] == "s2"
            assert server.metric('figtank_access_denied_total{listener="http",'
                                 'operation="subscribe"}') == 2
            # A new stream of the revoked topic is refused.
            status, _, _ = await writer.request(
                "GET", f"/topics/news/events?access_token={READER}")
            assert status == 403

            # The reader's token is removed: its remaining streams end too.
            access.write_text(policy('["sports"]', reader_token=False))
            assert server_reload(server)
            await sports.read_until(lambda s: s.ended)
            assert "bearer token is no longer valid" in sports.text
            code, _ = await ws_sports.wait_closed()
            assert code == 4003
            await produce(writer, "news", "n3")
            await others.read_until(lambda s: len(s.values()) == 3)
            assert server.metric('figtank_access_denied_total{listener="http",'
                                 'operation="token"}') == 2
            for client in (news.client, sports.client, others.client, writer):
                await client.aclose()
    assert revoked(logs) == [("sse", "user:reader", "-"), ("sse", "user:reader", "news"),
                             ("websocket", "user:reader", "-"),
                             ("websocket", "user:reader", "news")]


def server_reload(server) -> bool:
    """What SIGHUP does, in process: every reloader of the server."""
    return server.info.reload()


async def test_reloaded_jwt_keys_end_streams_signed_with_a_removed_key(
        tmp_path: Path) -> None:
    access = tmp_path / "access.toml"
    access.write_text(policy('["none"]'))
    secret = tmp_path / "hs256.key"
    old_key, new_key = "the-old-shared-secret-of-32-bytes!!", "the-new-shared-secret-of-32-bytes!!"
    secret.write_text(old_key)
    claims = {"sub": "jwt-alice", "exp": time.time() + 60}
    old = jwt.encode(claims, old_key, algorithm="HS256")
    new = jwt.encode(claims, new_key, algorithm="HS256")
    async with http_server(tmp_path, policy_file=access,
                           http_jwt_hs256_secret_file=str(secret)) as server:
        host, port = server.host, server.port
        writer = await H11Client.connect(host, port)
        await produce(writer, "news", "n1")
        stream = await SseReader.open(host, port, f"/topics/news/events?from=earliest"
                                      f"&access_token={old}")
        await stream.read_until(lambda s: len(s.values()) == 1)
        status, _, _ = await writer.request("GET", f"/topics/news/events?access_token={new}")
        assert status == 401  # not yet
        secret.write_text(new_key)
        assert server_reload(server)
        await stream.read_until(lambda s: s.ended)
        assert "bearer token is no longer valid" in stream.text
        status, _, body = await writer.request(
            "GET", "/topics/news/partitions/0/messages", headers=[
                ("authorization", f"Bearer {old}")])
        assert status == 401 and body["error"] == "invalid_token"
        fresh = await SseReader.open(host, port, f"/topics/news/events?from=earliest"
                                     f"&access_token={new}")
        await fresh.read_until(lambda s: len(s.values()) == 1)
        # A key file that can not be read keeps the key in force.
        secret.unlink()
        assert not server_reload(server)
        await produce(writer, "news", "n2")
        await fresh.read_until(lambda s: len(s.values()) == 2)
        assert not fresh.ended
        for client in (stream.client, fresh.client, writer):
            await client.aclose()


async def test_sighup_ends_a_revoked_sse_stream_of_a_serve_process(tmp_path: Path) -> None:
    access = tmp_path / "access.toml"
    access.write_text(policy('["news"]'))
    with figtank_serve("--data-dir", str(tmp_path / "data"), "--durability", "os",
                       "--tank-listen", "", "--figg-listen", "", "--metrics-listen", "",
                       "--kafka-listen", "", "--http-listen", "127.0.0.1:0",
                       "--policy-file", str(access)) as serving:
        assert serving.http is not None
        host, port = serving.http
        with trio.fail_after(20):
            writer = await H11Client.connect(host, port)
            await produce(writer, "news", "n1")
            stream = await SseReader.open(host, port, "/topics/news/events?from=earliest"
                                          f"&access_token={READER}")
            await stream.read_until(lambda s: len(s.values()) == 1)
            access.write_text(policy('["none"]'))
            serving.process.send_signal(signal.SIGHUP)
            await stream.read_until(lambda s: s.ended)
            assert "event: revoked" in stream.text
            await stream.client.aclose()
            await writer.aclose()
        assert serving.stop() == 0
    [line] = serving.events("http_stream_revoked")
    assert line["identity"] == "user:reader" and line["topic"] == "news"
