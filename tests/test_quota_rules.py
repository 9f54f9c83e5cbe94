"""Quota rules (issue 16, quotas item 1) and the token buckets behind them, on trio's mock
clock: parsing with one-line errors, first match wins, debt then delay, shared buckets per
principal, new rules applied to a connection that is waiting."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from gateway.auth.principal import Principal
from gateway.auth.quotas import QuotaRules, Quotas, Rate, parse_quotas
from gateway.core.metrics import Metrics

ALICE = Principal("figg", "CN=alice,O=acme")
BOB = Principal("tank", "CN=bob")
ANALYTICS = Principal("analytics")


def test_parse_gives_rates_and_bursts() -> None:
    rules = parse_quotas([
        {"who": ["CN=alice,O=acme"], "bytes_in_per_sec": 1048576, "requests_per_sec": 10,
         "burst_requests": 50},
        {"who": ["*"], "bytes_out_per_sec": 4096.5},
    ])
    alice = rules.for_principal(ALICE)
    assert alice is not None
    assert alice.bytes_in == Rate(1048576.0, 1048576.0)  # a second's worth by default
    assert alice.requests == Rate(10.0, 50.0)
    assert alice.bytes_out is None
    anyone = rules.for_principal(BOB)
    assert anyone is not None and anyone.bytes_out == Rate(4096.5, 4096.5)
    assert anyone.bytes_in is None and anyone.requests is None


def test_first_matching_entry_wins() -> None:
    rules = parse_quotas([
        {"who": ["listener:analytics"], "bytes_out_per_sec": 100},
        {"who": ["CN=bob", "CN=alice,O=acme"], "bytes_out_per_sec": 200},
        {"who": ["*"], "bytes_out_per_sec": 300},
    ])
    rate = {p: rules.for_principal(p).bytes_out.per_sec  # type: ignore[union-attr]
            for p in (ANALYTICS, ALICE, BOB, Principal("figg"))}
    assert rate == {ANALYTICS: 100, ALICE: 200, BOB: 200, Principal("figg"): 300}
    # A certificate on the analytics listener is covered by the listener's entry.
    assert rules.for_principal(Principal("analytics", "CN=carol")).bytes_out.per_sec == 100  # type: ignore[union-attr]
    assert parse_quotas([{"who": ["CN=bob"], "requests_per_sec": 1}]).for_principal(
        ALICE) is None
    assert QuotaRules().for_principal(ALICE) is None


def test_identities_are_compared_as_the_access_policy_compares_them() -> None:
    # Written once in the policy's [[rule]] and copied here, it must cover the same client.
    rules = parse_quotas([{"who": ["cn=alice, O=acme"], "bytes_in_per_sec": 10}])
    limits = rules.for_principal(Principal("tank", "CN=alice,O=acme"))
    assert limits is not None and limits.bytes_in is not None
    assert limits.bytes_in.per_sec == 10


@pytest.mark.parametrize(("entries", "message"), [
    ([{"who": ["*"], "bytes_in_per_sec": -5}],
     "quota[0].bytes_in_per_sec: must be a positive number, got -5"),
    ([{"who": ["*"], "bytes_in_per_sec": 1}, {"who": ["*"], "requests_per_sec": "10"}],
     "quota[1].requests_per_sec: must be a positive number, got '10'"),
    ([{"who": ["*"], "bytes_out_per_sec": True}],
     "quota[0].bytes_out_per_sec: must be a positive number, got True"),
    ([{"who": ["*"], "bytes_out_per_sec": float("inf")}],
     "quota[0].bytes_out_per_sec: must be a positive number, got inf"),
    ([{"who": [], "bytes_in_per_sec": 1}], "quota[0].who: must be a non-empty list"),
    ([{"who": "CN=bob", "bytes_in_per_sec": 1}], "quota[0].who: must be a non-empty list"),
    ([{"bytes_in_per_sec": 1}], "quota[0].who: must be a non-empty list"),
    ([{"who": ["*"]}], "quota[0]: names no limit"),
    ([{"who": ["*"], "bytes_in_per_sec": 1, "burst_bytes_out": 5}],
     "quota[0].burst_bytes_out: given without bytes_out_per_sec"),
    ([{"who": ["*"], "bytes_in_per_sec": 1, "burst_bytes_in": 0}],
     "quota[0].burst_bytes_in: must be a positive number, got 0"),
    ([{"who": ["*"], "bytes_per_sec": 1}], "quota[0].bytes_per_sec: unknown key"),
    (["nope"], "quota[0]: must be a table"),
])
def test_bad_entries_name_their_index_and_key(entries: list, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_quotas(entries)
    text = str(raised.value)
    assert text.startswith(message), text
    assert "\n" not in text


def quotas_for(*entries: dict) -> tuple[Quotas, Metrics]:
    metrics = Metrics()
    return Quotas(metrics, parse_quotas(list(entries))), metrics


def metric(metrics: Metrics, text: str) -> float:
    for line in metrics.render().decode().splitlines():
        if line.startswith(text + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_debt_is_paid_by_waiting(autojump_clock: trio.testing.MockClock) -> None:
    quotas, metrics = quotas_for({"who": ["*"], "bytes_in_per_sec": 1000,
                                  "burst_bytes_in": 500})
    state = quotas.acquire(ALICE)
    assert state.reads_limited and not state.out_limited
    assert state.receive_size == 4096  # a small burst: small reads
    start = trio.current_time()
    await state.wait_in()  # the burst is there: no wait
    assert trio.current_time() == start
    state.took_in(3500, 1)  # a read far over the burst is served, then paid for
    await state.wait_in()
    assert trio.current_time() - start == pytest.approx(3.0)
    assert metric(metrics, 'figtank_quota_delay_seconds_total{direction="in"}') == \
        pytest.approx(3.0)
    assert metric(metrics, 'figtank_limit_hits_total{limit="quota"}') == 1
    # The same episode goes on while each read waits: counted once.
    state.took_in(1000, 1)
    await state.wait_in()
    assert metric(metrics, 'figtank_limit_hits_total{limit="quota"}') == 1
    # A wait that is not needed ends the episode; the next throttling counts again.
    await trio.sleep(10)
    await state.wait_in()
    state.took_in(2000, 1)
    await state.wait_in()
    assert metric(metrics, 'figtank_limit_hits_total{limit="quota"}') == 2


async def test_requests_and_bytes_out(autojump_clock: trio.testing.MockClock) -> None:
    quotas, metrics = quotas_for({"who": ["*"], "requests_per_sec": 10,
                                  "bytes_out_per_sec": 100})
    state = quotas.acquire(BOB)
    start = trio.current_time()
    state.took_in(10**6, 30)  # no bytes-in limit: only the 30 requests count
    await state.wait_in()
    assert trio.current_time() - start == pytest.approx(2.0)
    assert not state.out_in_debt()
    state.took_out(300)
    assert state.out_in_debt()
    await state.wait_out()
    assert trio.current_time() - start == pytest.approx(4.0)
    assert metric(metrics, 'figtank_quota_delay_seconds_total{direction="out"}') == \
        pytest.approx(2.0)


async def test_principals_have_their_own_buckets_connections_share_them(
        autojump_clock: trio.testing.MockClock) -> None:
    quotas, _ = quotas_for({"who": ["*"], "bytes_in_per_sec": 100})
    first, second = quotas.acquire(ALICE), quotas.acquire(ALICE)
    other = quotas.acquire(BOB)
    assert first is second and other is not first and len(quotas) == 2
    first.took_in(300, 0)
    start = trio.current_time()
    await other.wait_in()  # bob's bucket is full
    assert trio.current_time() == start
    await second.wait_in()  # alice's second connection pays for the first's read
    assert trio.current_time() - start == pytest.approx(2.0)
    quotas.release(first)
    assert len(quotas) == 2
    quotas.release(second)
    quotas.release(other)
    assert len(quotas) == 0  # dropped with their last connection
    assert quotas.acquire(ALICE) is not first


async def test_new_rules_apply_to_a_waiting_connection(
        autojump_clock: trio.testing.MockClock) -> None:
    quotas, _ = quotas_for({"who": ["*"], "bytes_in_per_sec": 10})
    state = quotas.acquire(ALICE)
    unlimited = quotas.acquire(BOB)
    state.took_in(1000, 1)  # 100 s of debt at 10 B/s
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(state.wait_in)
        await trio.sleep(1)
        quotas.replace_rules(parse_quotas([{"who": ["CN=alice,O=acme"],
                                            "bytes_in_per_sec": 1000},
                                           {"who": ["CN=bob"], "bytes_out_per_sec": 1}]))
    # The debt left (980 bytes after a second) is paid at 1000 B/s: 0.98 s later, not 98.
    assert trio.current_time() - start == pytest.approx(1.98)
    assert unlimited.out_limited and not unlimited.reads_limited
    quotas.replace_rules(QuotaRules())
    assert not state.reads_limited and state.bytes_in is None
    state.took_in(10**9, 10**9)  # nothing limits it now
    await state.wait_in()
    assert trio.current_time() - start == pytest.approx(1.98)
