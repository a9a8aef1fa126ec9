"""report.html, its PNG charts and the console summary, from rows the job collected.

Plain Python and matplotlib only: nothing here touches Spark, so the report is a static page
that opens anywhere, and this module can be tested and changed without a SparkSession.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from matplotlib import dates
from matplotlib.axes import Axes
from matplotlib.figure import Figure

Row = dict[str, Any]
_date2num: Callable[[datetime], float] = dates.date2num  # untyped in matplotlib's stubs
STATUSES = ("ok", "lost", "duplicated", "late", "incomplete")


@dataclass
class ReportData:
    inputs: list[str]
    out: str
    late_ms: float
    elapsed_s: float
    rows: dict[str, list[Row]]  # result sets by name, as job.collect_report makes them


# --- formatting -------------------------------------------------------------------------------


def _ns_time(ns: int | None) -> str:
    if ns is None:
        return ""
    moment = datetime.fromtimestamp(ns / 1e9, tz=UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


def _fmt(value: Any, column: str) -> str:
    if value is None:
        return ""
    if column.endswith("_ns"):
        return _ns_time(value)
    if column == "share":
        return f"{100 * value:.1f} %"
    if isinstance(value, bool):
        return "yes" if value else ""
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 1e6 else f"{value:,.0f}"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def _table(rows: Sequence[Row], columns: Sequence[str], empty: str = "none") -> str:
    if not rows:
        return f"<p class='empty'>{html.escape(empty)}</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c), c))}</td>" for c in columns) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# --- summary ----------------------------------------------------------------------------------


def _first(rows: Sequence[Row]) -> Row:
    return rows[0] if rows else {}


def summary(data: ReportData) -> dict[str, Any]:
    """The headline numbers (also written as summary.json for scripts and alerts)."""
    rows = data.rows
    status = dict.fromkeys(STATUSES, 0)
    for r in rows.get("message_status", []):
        status[str(r["status"])] = int(r["count"])
    d = _first(rows.get("delivery_stats", []))
    pct = d.get("pct") or [None, None]
    views = rows.get("failover_timeline", [])
    hot_p = _first(rows.get("hot_partitions", []))
    hot_t = _first(rows.get("hot_topics", []))
    no_master = [v["max_no_master_ms"] for v in views if v.get("max_no_master_ms") is not None]
    return {
        "spans": _first(rows.get("span_count", [])).get("n", 0),
        "messages": sum(status.values()),
        "message_status": status,
        "deliveries": d.get("deliveries") or 0,
        "deliveries_lost": d.get("lost") or 0,
        "deliveries_duplicated": d.get("duplicated") or 0,
        "deliveries_late": d.get("late") or 0,
        "latency_p50_ms": pct[0],
        "latency_p99_ms": pct[1],
        "latency_max_ms": d.get("max_ms"),
        "late_ms": data.late_ms,
        "orphan_traces": _first(rows.get("orphan_count", [])).get("n", 0),
        "view_changes": len(views),
        "nodes_lost": sorted({str(v["node_lost"]) for v in views if v.get("node_lost")}),
        "partitions_failed_over": sum(int(v.get("partitions_failed_over") or 0) for v in views),
        "max_no_master_ms": max(no_master) if no_master else None,
        "hottest_partition": hot_p.get("partition"),
        "hottest_partition_share": hot_p.get("share"),
        "partitions_seen": _first(rows.get("partition_count", [])).get("n", 0),
        "hottest_topic": hot_t.get("topic"),
        "hottest_topic_share": hot_t.get("share"),
        "elapsed_s": round(data.elapsed_s, 1),
        "inputs": data.inputs,
        "out": data.out,
    }


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f} ms"


def console_summary(s: dict[str, Any], report_path: Path) -> str:
    status = s["message_status"]
    lines = [
        f"hexmq traces: {s['spans']:,} spans, {s['messages']:,} messages, "
        f"{s['deliveries']:,} deliveries in {s['elapsed_s']} s",
        "  messages: " + ", ".join(f"{k} {status[k]:,}" for k in STATUSES),
        f"  deliveries: lost {s['deliveries_lost']:,}, duplicated {s['deliveries_duplicated']:,}, "
        f"late (> {s['late_ms']:g} ms) {s['deliveries_late']:,}; "
        f"traces without mqtt.publish span {s['orphan_traces']:,}",
        f"  publish -> delivery: p50 {_ms(s['latency_p50_ms'])}, p99 {_ms(s['latency_p99_ms'])}, "
        f"max {_ms(s['latency_max_ms'])}",
        f"  view changes {s['view_changes']} (nodes lost: {', '.join(s['nodes_lost']) or 'none'}), "
        f"partitions failed over {s['partitions_failed_over']}, "
        f"longest without master {_ms(s['max_no_master_ms'])}",
    ]
    if s["hottest_partition"] is not None:
        lines.append(
            f"  hottest partition {s['hottest_partition']} "
            f"({100 * s['hottest_partition_share']:.1f} % of appends over "
            f"{s['partitions_seen']} partitions); hottest topic {s['hottest_topic']!r} "
            f"({100 * (s['hottest_topic_share'] or 0):.1f} % of messages)"
        )
    lines.append(f"  report: {report_path}")
    return "\n".join(lines)


# --- charts -----------------------------------------------------------------------------------


def _figure() -> tuple[Figure, Axes]:
    # Figure without pyplot: no global state and no GUI backend, safe in any process.
    fig = Figure(figsize=(10, 4), dpi=100, layout="constrained")
    return fig, fig.add_subplot()


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _when(second: float) -> float:
    """Matplotlib's date number of an epoch second (the axes are then told they show dates)."""
    return float(_date2num(datetime.fromtimestamp(second, tz=UTC)))


def _latency_chart(rows: dict[str, list[Row]]) -> Figure | None:
    series = rows.get("latency_timeline", [])
    if not series:
        return None
    fig, ax = _figure()
    x = [_when(r["second"]) for r in series]
    for column, label in (("p50_ms", "p50"), ("p99_ms", "p99"), ("max_ms", "max")):
        ax.plot(x, [r[column] for r in series], label=label, linewidth=1)
    lost = [(x[i], r["lost"]) for i, r in enumerate(series) if r["lost"]]
    if lost:
        # Counts on their own axis, kept to the lower third so they do not hide the latency
        # spike they may explain.
        counts = ax.twinx()
        xs, ns = zip(*lost, strict=True)
        counts.bar(xs, ns, width=1 / 86400, color="red", alpha=0.5, label="with lost delivery")
        counts.set_ylim(0, 3 * max(ns))
        counts.set_ylabel("messages with a lost delivery", color="red")
    for view in rows.get("failover_timeline", []):
        start = view["detected_ns"] / 1e9
        end = start + (view["window_ms"] or 0) / 1e3
        ax.axvspan(_when(start), _when(end), color="orange", alpha=0.3)
        ax.annotate(
            f"view {view['view_epoch']}: {view['node_lost'] or 'change'}",
            (_when(start), 1),
            xycoords=("data", "axes fraction"),
            va="top",
            fontsize=8,
        )
    ax.set_title("publish -> delivery latency per second (slowest subscriber); orange: view change")
    ax.set_ylabel("ms")
    if all(r["p50_ms"] and r["p50_ms"] > 0 for r in series):
        ax.set_yscale("log")
    ax.legend(loc="upper right", fontsize=8)
    ax.xaxis_date(tz=UTC)
    fig.autofmt_xdate()
    return fig


def _stage_chart(rows: dict[str, list[Row]]) -> Figure | None:
    stages = rows.get("stage_latency_overall", [])
    if not stages:
        return None
    fig, ax = _figure()
    width = 0.25
    positions = range(len(stages))
    for i, (column, label) in enumerate((("p50_ms", "p50"), ("p95_ms", "p95"), ("p99_ms", "p99"))):
        ax.bar(
            [p + (i - 1) * width for p in positions],
            [r[column] or 0 for r in stages],
            width,
            label=label,
        )
    ax.set_xticks(list(positions), [r["stage"] for r in stages])
    ax.set_ylabel("ms")
    ax.set_title("latency per stage (span durations)")
    ax.legend(fontsize=8)
    return fig


def _replication_chart(rows: dict[str, list[Row]]) -> Figure | None:
    series = rows.get("replication_by_follower", [])
    if not series:
        return None
    fig, ax = _figure()
    by_follower: dict[str, list[Row]] = {}
    for r in series:
        by_follower.setdefault(str(r["follower"]), []).append(r)
    for follower, points in sorted(by_follower.items()):
        x = [
            float(
                _date2num(datetime.strptime(p["minute"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC))
            )
            for p in points
        ]
        ax.plot(x, [p["p99_ms"] for p in points], marker=".", label=follower)
    ax.set_title("replicate p99 per follower and minute (worst partition)")
    ax.set_ylabel("ms")
    ax.legend(title="follower", fontsize=8)
    ax.xaxis_date(tz=UTC)
    fig.autofmt_xdate()
    return fig


def _partition_chart(rows: dict[str, list[Row]]) -> Figure | None:
    hot = rows.get("hot_partitions", [])
    if not hot:
        return None
    fig, ax = _figure()
    ax.bar([str(r["partition"]) for r in hot], [100 * r["share"] for r in hot])
    seen = _first(rows.get("partition_count", [])).get("n", 0)
    if seen:
        ax.axhline(100 / seen, color="grey", linestyle="--", label="even spread")
        ax.legend(fontsize=8)
    ax.set_xlabel("partition")
    ax.set_ylabel("% of appends")
    ax.set_title("hottest partitions")
    return fig


CHARTS: dict[str, tuple[str, Callable[[dict[str, list[Row]]], Figure | None]]] = {
    "latency": ("End-to-end latency", _latency_chart),
    "stages": ("Latency per stage", _stage_chart),
    "replication": ("Replication", _replication_chart),
    "partitions": ("Hot partitions", _partition_chart),
}


# --- page -------------------------------------------------------------------------------------

_STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: left; }
th { background: #eee; }
img { max-width: 100%; }
.empty { color: #777; }
.bad { color: #b00; font-weight: bold; }
"""


def _images(data: ReportData, out_dir: Path) -> dict[str, str]:
    """Renders the charts to charts/NAME.png and returns <img> tags embedding them (the page
    stays one self-contained file when mailed; the PNGs are there for slides and tickets)."""
    charts_dir = out_dir / "charts"
    charts_dir.mkdir(parents=True, exist_ok=True)
    tags = {}
    for name, (title, draw) in CHARTS.items():
        fig = draw(data.rows)
        if fig is None:
            tags[name] = "<p class='empty'>no data</p>"
            continue
        png = _png(fig)
        (charts_dir / f"{name}.png").write_bytes(png)
        src = "data:image/png;base64," + base64.b64encode(png).decode()
        tags[name] = f"<img alt='{html.escape(title)}' src='{src}'>"
    return tags


def write_report(data: ReportData, out_dir: Path) -> Path:
    """Writes out_dir/report.html (charts embedded) and out_dir/charts/*.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    s = summary(data)
    rows = data.rows
    img = _images(data, out_dir)
    status = s["message_status"]
    bad = status["lost"] + status["duplicated"]
    headline = ", ".join(f"{k}: {status[k]:,}" for k in STATUSES)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>hexmq trace report</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>hexmq trace report</h1>",
        f"<p>Input: {html.escape(', '.join(data.inputs))}<br>Tables: {html.escape(data.out)}"
        f"<br>Made {datetime.now(tz=UTC):%Y-%m-%d %H:%M} UTC in {s['elapsed_s']} s. "
        "Times are UTC.</p>",
        "<h2>Summary</h2>",
        f"<p>{s['spans']:,} spans, {s['messages']:,} published messages, "
        f"{s['deliveries']:,} deliveries seen. Messages: "
        f"<span class='{'bad' if bad else ''}'>{html.escape(headline)}</span>. "
        f"Traces without an mqtt.publish span: {s['orphan_traces']:,}.<br>"
        f"Publish &rarr; delivery: p50 {_ms(s['latency_p50_ms'])}, "
        f"p99 {_ms(s['latency_p99_ms'])}, max {_ms(s['latency_max_ms'])}; "
        f"late means above {s['late_ms']:g} ms.</p>",
        "<h2>Delivery audit</h2>",
        "<p>Messages with a lost (expected delivery without a deliver span, failed, or without "
        "client ack at QoS &ge; 1), duplicated or late delivery, or with a span of the publish "
        "path missing (incomplete). Worst first; look a trace id up in Jaeger. "
        f"{len(rows.get('problem_messages', []))} of {s['messages'] - status['ok']:,} shown; "
        "all are in the Parquet table <code>messages</code>.</p>",
        _table(
            rows.get("problem_messages", []),
            [
                "status",
                "trace_id",
                "message_id",
                "topic",
                "qos",
                "edge_node",
                "publish_ns",
                "expected_deliveries",
                "delivered",
                "lost",
                "duplicated",
                "late",
                "latency_ms_max",
                "missing_stages",
            ],
            "every message was delivered once, in time",
        ),
        "<h3>Deliveries with a problem</h3>",
        _table(
            rows.get("problem_deliveries", []),
            [
                "status",
                "trace_id",
                "subscriber_hash",
                "node",
                "qos",
                "deliver_spans",
                "latency_ms",
                "ack_latency_ms",
            ],
        ),
        "<h3>Traces without an mqtt.publish span</h3>",
        _table(rows.get("orphan_traces", []), ["trace_id", "spans", "names", "first_start_ns"]),
        f"<h2>{CHARTS['latency'][0]}</h2>",
        img["latency"],
        f"<h2>{CHARTS['stages'][0]}</h2>",
        img["stages"],
        _table(
            rows.get("stage_latency_overall", []),
            ["stage", "spans", "p50_ms", "p95_ms", "p99_ms", "max_ms"],
        ),
        "<h3>Per node</h3>",
        _table(
            rows.get("stage_latency_by_node", []),
            ["stage", "node", "spans", "p50_ms", "p95_ms", "p99_ms", "max_ms"],
        ),
        "<p>Per minute: Parquet table <code>stage_latency</code>.</p>",
        f"<h2>{CHARTS['replication'][0]}</h2>",
        img["replication"],
        "<h3>Slowest partition/follower pairs</h3>",
        _table(
            rows.get("replication_worst", []),
            ["partition", "follower", "spans", "p99_ms", "max_ms", "max_lag_entries", "errors"],
        ),
        f"<h2>{CHARTS['partitions'][0]}</h2>",
        img["partitions"],
        _table(
            rows.get("hot_partitions", []),
            ["partition", "appends", "share", "load_vs_mean", "p99_ms", "max_ms"],
        ),
        "<h3>Hottest topics</h3>",
        _table(rows.get("hot_topics", []), ["topic", "messages", "share", "load_vs_mean"]),
        "<h2>Failover timeline</h2>",
        _table(
            rows.get("failover_timeline", []),
            [
                "view_epoch",
                "node_lost",
                "detected_ns",
                "installed_ns",
                "detection_ms",
                "partitions_failed_over",
                "max_no_master_ms",
                "window_ms",
                "affected_publishes",
                "affected_latency_p50_ms",
                "affected_latency_max_ms",
                "affected_lost",
            ],
            "no membership view change in these traces",
        ),
        "<h3>Partitions failed over (longest without master first)</h3>",
        _table(
            rows.get("partition_failovers", []),
            [
                "view_epoch",
                "partition",
                "old_master",
                "new_master",
                "new_epoch",
                "failover_start_ns",
                "failover_ms",
                "no_master_ms",
            ],
        ),
        "</body></html>",
    ]
    path = out_dir / "report.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
