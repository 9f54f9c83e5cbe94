"""The SASL state machines without I/O (RFC 7677's test vector), the ``[[user]]`` entries
of the policy file, ``user:NAME`` in rules and quotas, the listener settings and
``figtank users add`` (issue 17, "Access")."""

from __future__ import annotations

import base64
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from gateway.auth.access import load_access
from gateway.auth.policy import Operation, PolicyError, parse_policy
from gateway.auth.principal import Principal
from gateway.auth.quotas import parse_quotas
from gateway.auth.sasl import SaslFailed, scram_credential, server
from gateway.auth.users import parse_users, user_entry
from gateway.core.config import ConfigError, settings_from_mapping
from tests.kafka.scram_client import ScramClient

# RFC 7677 section 3.
RFC_SALT = "W22ZaJ0SNY7soEsUEjb6gQ=="
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SERVER_FIRST = (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
RFC_CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def rfc_users(name: str) -> dict[str, object] | None:
    credential = scram_credential("pencil", "SCRAM-SHA-256", 4096,
                                  base64.b64decode(RFC_SALT))
    return {"SCRAM-SHA-256": credential} if name == "user" else None


def test_rfc7677_test_vector() -> None:
    exchange = server("SCRAM-SHA-256", rfc_users, nonce=RFC_SERVER_NONCE)  # type: ignore[arg-type]
    assert exchange.step(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert not exchange.done
    assert exchange.step(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert exchange.done and exchange.user == "user"
    with pytest.raises(SaslFailed, match="already complete"):
        exchange.step(b"c=biws")


def test_rfc7677_vector_with_a_wrong_proof_fails() -> None:
    exchange = server("SCRAM-SHA-256", rfc_users, nonce=RFC_SERVER_NONCE)  # type: ignore[arg-type]
    exchange.step(RFC_CLIENT_FIRST)
    bad = RFC_CLIENT_FINAL[:-6] + b"AAAAA="
    with pytest.raises(SaslFailed, match="invalid credentials with SASL mechanism "
                                         "SCRAM-SHA-256"):
        exchange.step(bad)
    assert not exchange.done and exchange.user is None


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_round_trip_with_an_independent_client(mechanism: str) -> None:
    users = parse_users(tomllib.loads(user_entry("we,ird=name", "pässword", [mechanism],
                                                 5000))["user"])
    client = ScramClient(mechanism, "we,ird=name", "pässword")
    exchange = server(mechanism, users.lookup)
    first = exchange.step(client.first())
    assert b",i=5000" in first
    assert client.verify(exchange.step(client.final(first)))
    assert exchange.user == "we,ird=name"


def test_plain_checks_the_scram_credential() -> None:
    users = parse_users(tomllib.loads(user_entry("bob", "pw", ["SCRAM-SHA-256"]))["user"])
    ok = server("PLAIN", users.lookup)
    assert ok.step(b"bob\0bob\0pw") == b"" and ok.user == "bob"
    for token, says in ((b"\0bob\0wrong", "Invalid username or password"),
                        (b"\0eve\0pw", "Invalid username or password"),
                        (b"eve\0bob\0pw", "authorization id"),
                        (b"\0bob", "malformed token"), (b"\0\0pw", "empty")):
        with pytest.raises(SaslFailed, match=says):
            server("PLAIN", users.lookup).step(token)


@pytest.mark.parametrize(("mechanism", "user", "password", "why"), [
    ("SCRAM-SHA-512", "bob", "pw", "user 'bob' has no SCRAM-SHA-512 credential (it has "
                                   "SCRAM-SHA-256)"),
    ("SCRAM-SHA-256", "bob", "wrong", "wrong password for user 'bob'"),
    ("SCRAM-SHA-256", "eve", "pw", "no user 'eve'"),
    ("PLAIN", "bob", "wrong", "wrong password for user 'bob'"),
    ("PLAIN", "eve", "pw", "no user 'eve'"),
])
def test_a_failure_says_why_to_the_log_only(mechanism: str, user: str, password: str,
                                            why: str) -> None:
    users = parse_users(tomllib.loads(user_entry("bob", "pw", ["SCRAM-SHA-256"]))["user"])
    exchange = server(mechanism, users.lookup)
    with pytest.raises(SaslFailed) as failed:
        if mechanism == "PLAIN":
            exchange.step(f"\0{user}\0{password}".encode())
        else:
            client = ScramClient(mechanism, user, password)
            exchange.step(client.final(exchange.step(client.first())))
    assert failed.value.detail == why
    assert why not in str(failed.value)  # the client's message does not tell


def test_credentials_never_hold_the_password_and_need_4096_iterations() -> None:
    entry = user_entry("bob", "hunter2-password", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
    assert "hunter2" not in entry
    assert set(tomllib.loads(entry)["user"][0]) == {"name", "scram_sha_256", "scram_sha_512"}
    with pytest.raises(ValueError, match="at least 4096"):
        scram_credential("pw", "SCRAM-SHA-256", 1000)


@pytest.mark.parametrize(("entries", "says"), [
    ([{"name": "a"}], "user[0]: no credential"),
    ([{"name": ""}], "user[0].name"),
    ([{"name": "a", "pasword": "x"}], "user[0].pasword: unknown key"),
    ([{"name": "a", "scram_sha_256": {"salt": "AA==", "iterations": 10, "stored_key": "AA==",
                                      "server_key": "AA=="}}], "iterations: must be"),
    ([{"name": "a", "scram_sha_256": {"salt": "%%", "iterations": 4096,
                                      "stored_key": "AA==", "server_key": "AA=="}}],
     "salt: must be base64"),
    ([{"name": "a", "scram_sha_256": {"salt": "AA==", "iterations": 4096}}],
     "stored_key: missing"),
])
def test_bad_user_entries_are_one_line_naming_where(entries: list[object], says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("]", r"\]")):
        parse_users(entries)


def test_a_bad_user_entry_in_the_policy_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "access.toml"
    path.write_text("[[user]]\nname = \"a\"\n")
    with pytest.raises(PolicyError, match=f"{path}: user\\[0\\]: no credential"):
        load_access(path)
    path.write_text(user_entry("a", "pw", ["SCRAM-SHA-256"]))
    assert "a" in load_access(path).users


def test_user_names_in_rules_and_quotas() -> None:
    policy = parse_policy({"default": "deny", "rule": [
        {"who": ["user:alice"], "topics": ["t"], "allow": ["produce"]}]})
    alice = Principal("kafka", None, "alice")
    assert policy.allows(alice, "t", Operation.PUBLISH)
    assert not policy.allows(Principal("kafka", None, "Alice"), "t", Operation.PUBLISH)
    assert not policy.allows(Principal("kafka", "CN=alice"), "t", Operation.PUBLISH)
    assert alice.name == "user:alice"
    with pytest.raises(PolicyError, match="names no user"):
        parse_policy({"rule": [{"who": ["user:"], "topics": ["t"], "allow": ["produce"]}]})
    quotas = parse_quotas([{"who": ["user:alice"], "requests_per_sec": 5}])
    assert quotas.for_principal(alice) is not None
    assert quotas.for_principal(Principal("kafka")) is None


def test_listener_sasl_settings() -> None:
    def settings(table: dict[str, object], **more: object) -> object:
        return settings_from_mapping({"listen": {"kafka": "127.0.0.1:0"},
                                      "listeners": {"kafka": table}, **more})

    ok = settings({"sasl_mechanisms": ["SCRAM-SHA-256", "PLAIN"],
                   "sasl_plain_without_tls": True})
    assert ok.listeners["kafka"].sasl_mechanisms == ("SCRAM-SHA-256", "PLAIN")  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="PLAIN sends passwords in the clear"):
        settings({"sasl_mechanisms": ["PLAIN"]})
    with pytest.raises(ConfigError, match="unknown SASL mechanism 'GSSAPI'"):
        settings({"sasl_mechanisms": ["GSSAPI"]})
    with pytest.raises(ConfigError, match="SASL is served on Kafka listeners only"):
        settings_from_mapping({"listeners": {"tank": {"sasl_mechanisms": ["PLAIN"]}}})


def figtank(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=30)


def test_users_add_prints_an_entry_that_logs_in(tmp_path: Path) -> None:
    made = figtank("users", "add", "erin", "--mechanism", "SCRAM-SHA-512",
                   stdin="open sesame\n")
    assert made.returncode == 0, made.stderr
    users = parse_users(tomllib.loads(made.stdout)["user"])
    assert users.lookup("erin") is not None and "open sesame" not in made.stdout
    plain = figtank("users", "add", "erin", "--mechanism", "PLAIN",
                    "--password-file", str(_write(tmp_path / "pw", "pw2\n")))
    assert "scram_sha_256" in plain.stdout
    exchange = server("PLAIN", parse_users(tomllib.loads(plain.stdout)["user"]).lookup)
    exchange.step(b"\0erin\0pw2")
    assert exchange.user == "erin"


@pytest.mark.parametrize(("args", "stdin", "says"), [
    (["--mechanism", "MD5"], "pw\n", "invalid choice: 'MD5'"),
    ([], "\n", "the password is empty"),
    (["--iterations", "100"], "pw\n", "--iterations must be at least 4096"),
    (["--password-file", "/nonexistent/pw"], "", "No such file"),
])
def test_users_add_refuses_bad_input_in_one_line(args: list[str], stdin: str,
                                                 says: str) -> None:
    result = figtank("users", "add", "erin", *args, stdin=stdin)
    assert result.returncode == 2
    assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(("prefix", "ok"), [
    ("fyko+d2lbbFgONRv9qkxdawL", True),  # the client's nonce again: librdkafka < 2.6.1
    ("x", False), ("fyko+d2lbbFgONRv9qkxdaw", False), ("fyko+d2lbbFgONRv9qkxdawLfyko", False)])
def test_the_nonce_librdkafka_before_2_6_1_sends(prefix: str, ok: bool) -> None:
    users = parse_users(tomllib.loads(user_entry("u", "pw", ["SCRAM-SHA-256"]))["user"])
    client = ScramClient("SCRAM-SHA-256", "u", "pw")  # nonce fyko+d2lbbFgONRv9qkxdawL
    exchange = server("SCRAM-SHA-256", users.lookup)
    first = exchange.step(client.first())
    final = client.final(first, nonce_prefix=prefix)
    if ok:
        assert client.verify(exchange.step(final)) and exchange.user == "u"
    else:
        with pytest.raises(SaslFailed, match="the nonce does not match"):
            exchange.step(final)
        assert not exchange.done
