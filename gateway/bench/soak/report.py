"""The soak's report: one dict (printed as JSON with ``--json``) and its text form."""

from __future__ import annotations

from typing import Any

MiB = 1024 * 1024


def acknowledged_lost(good: dict[str, Any]) -> int | None:
    """Acknowledged messages of the well-behaved client missing from its topics; None
    when they could not be counted (the client failed or a topic could not be read)."""
    topics = good.get("topics")
    if not topics:
        return None
    losses: list[int | None] = [t.get("lost") for t in topics.values()]
    counted = [lost for lost in losses if lost is not None]
    if len(counted) < len(losses):
        return None
    return sum(counted)


def verdict(result: dict[str, Any]) -> bool:
    """Whether the soak passed: nothing acknowledged lost and the server survived."""
    survived: bool = result["server"]["survived"]
    return result["acknowledged_lost"] == 0 and survived


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MiB:,.1f} MiB"


def _size(value: int) -> str:
    if value >= MiB:
        return f"{value / MiB:,.1f} MiB"
    return f"{value / 1024:,.1f} KiB"


def _recovery(server: dict[str, Any]) -> str:
    seconds = server.get("health_after_abuse_seconds")
    return "not at all" if seconds is None else f"after {seconds:g} s"


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _latency_line(name: str, stats: dict[str, Any]) -> str:
    if not stats.get("count"):
        return f"  {name:<24} no samples (errors {stats.get('errors', 0)})"
    extra = [f"{k} {stats[k]:,}" for k in ("errors", "reconnects") if stats.get(k)]
    return (f"  {name:<24} p50 {stats['p50']:,.2f} ms  p99 {stats['p99']:,.2f} ms  "
            f"max {stats['max']:,.2f} ms  ({stats['count']:,} samples"
            + "".join(f", {e}" for e in extra) + ")")


def _notes(notes: dict[str, Any]) -> str:
    parts = []
    for key, value in notes.items():
        if key == "sparse_rounds":
            value = "; ".join(
                f"sparse {r['sparse_code']}, then {r['after_codes']}, figg {r['figg_publish']}"
                for r in value) or "none"
        parts.append(f"{key}={value}")
    return ", ".join(parts)


def text(result: dict[str, Any]) -> str:
    """The report for people."""
    server = result["server"]
    rss, fds, good = result["rss_bytes"], result["descriptors"], result["well_behaved"]
    lost = result["acknowledged_lost"]
    lines = [
        f"figtank soak: {result['abuse_seconds']:.1f} s of abuse "
        f"(of {result['seconds']:g} planned), then {result['settle_seconds']:g} s to settle; "
        f"server pid {server['pid']} ({'started by the soak' if server['own'] else 'attached'}"
        + (f", {server['durability']}" if server.get("durability") else "") + ")",
        f"server survived:      {'yes' if server['survived'] else 'NO'} (process "
        f"{'alive' if server['alive'] else 'gone'}, /health {server['health'] or 'no answer'}"
        f"; after the abuse it answered /health {_recovery(server)})",
        f"acknowledged lost:    {'unknown (could not read back)' if lost is None else lost}"
        + (" (must be 0)" if lost else ""),
        f"RSS:                  start {_mib(rss['start'])}, peak {_mib(rss['peak'])}, "
        f"final {_mib(rss['final'])}",
        f"descriptors:          start {_count(fds['start'])}, peak {_count(fds['peak'])}, "
        f"final {_count(fds['final'])}",
    ]
    if result.get("memory_guard"):
        lines.append(f"memory guard:         {result['memory_guard']}")
    if "error" in good:
        lines.append(f"well-behaved client:  FAILED: {good['error']}")
    else:
        lines.append("well-behaved client latency (a publish never acknowledged counts as "
                     "one sample of the time it waited):")
        lines += [_latency_line(name, stats) for name, stats in good["latency_ms"].items()]
        for name, topic in good["topics"].items():
            lines.append(f"  {name} topic: {topic['acked']:,} acknowledged of "
                         f"{topic['sent']:,} sent ({topic['skipped']:,} skipped while "
                         f"late), lost {topic['lost'] if topic['lost'] is not None else '?'}")
        if good.get("unacked_at_end"):
            lines.append(f"  figg publishes still unacknowledged after the drain: "
                         f"{good['unacked_at_end']:,}")
    lines.append("abusers:")
    for name, tally in result["abusers"].items():
        lines.append(f"  {name:<20} connections {tally['connections']:,}, refused "
                     f"{tally['refused']:,}, closed by server {tally['closed_by_server']:,}, "
                     f"sent {_size(tally['sent_bytes'])}")
        if tally["notes"]:
            lines.append(f"  {'':<20} {_notes(tally['notes'])}")
        if tally["error"]:
            lines.append(f"  {'':<20} ended early: {tally['error']}")
    if result.get("limit_hits"):
        hits = ", ".join(f"{k}={v:g}" for k, v in result["limit_hits"].items())
        lines.append(f"limit hits (/metrics): {hits}")
    shutdown = server.get("shutdown")
    if shutdown:
        lines.append(f"server shutdown:      {shutdown['seconds']:g} s after SIGTERM, exit "
                     f"status {shutdown['exit_status']}"
                     + (" (killed: it did not stop in time)" if shutdown["killed"] else ""))
    log = server.get("log")
    if log:
        lines.append(f"server log:           {log['lines']:,} lines, "
                     f"{log['unstructured_lines']:,} not JSON (tracebacks)")
        for event, count in log["warnings_and_errors"].items():
            lines.append(f"  {event:<36} {count:,}")
    lines.append("PASS" if result["ok"] else "FAIL")
    return "\n".join(lines)
