"""End to end: a real 3-node cluster (RF 2) writes OTLP JSON trace files (`--trace-dir`), known
messages flow across nodes, and the Spark job (`hexmq traces analyze`) audits every one of them
as delivered exactly once, with the stages it crossed and the replication to followers."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hexmq.mqtt import PubAck, Publish
from tests.support.rawclient import RawClient
from tests.support.unique import uid

MESSAGES = 20


# The Spark job in a fresh JVM takes minutes on a loaded machine (make test: 130 s with the
# other Spark tests beside it on 2 cores); a hang detector above the job's own 300 s bound.
@pytest.mark.timeout(420)
async def test_spark_audit_of_a_real_cluster(hexmq_cluster, tmp_path: Path) -> None:
    trace_dir = tmp_path / "traces"
    cluster = hexmq_cluster(nodes=3, extra=["--trace-dir", str(trace_dir), "--rf", "2"])
    topic = f"audit/{uid(8)}"
    subs = []
    for node in (2, 3):
        sub, _ = await RawClient.connect(cluster.mqtt_port(node), f"aud-{node}-{uid(32)}")
        await sub.subscribe(topic, qos=1)
        subs.append(sub)
    pub, _ = await RawClient.connect(cluster.mqtt_port(1), f"aud-pub-{uid(32)}")
    for i in range(MESSAGES):
        await pub.publish(topic, f"{i}".encode(), qos=1)
    for sub in subs:
        for _ in range(MESSAGES):
            got = await sub.expect(Publish)
            assert got.packet_id is not None
            await sub.send(PubAck(got.packet_id))
    for client in (*subs, pub):
        await client.close()
    cluster.down()  # every service flushes its spans

    out = tmp_path / "analysis"
    argv = [str(Path(sys.executable).parent / "hexmq"), "traces", "analyze", str(trace_dir)]
    job = await asyncio.to_thread(
        subprocess.run,
        [*argv, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert job.returncode == 0, job.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    # Every publish of this test is a message; the cluster's own readiness probes publish none.
    assert summary["messages"] == MESSAGES, summary
    assert summary["message_status"]["ok"] == MESSAGES, summary
    assert summary["deliveries"] == 2 * MESSAGES
    assert summary["deliveries_lost"] == 0
    assert summary["deliveries_duplicated"] == 0
    assert summary["orphan_traces"] == 0
    report = (out / "report.html").read_text()
    assert report.count("<table") >= 3
    # Every append waited on its partition's follower: the report names the followers.
    worst = report.split("Slowest partition/follower pairs", 1)[1].split("</table>", 1)[0]
    assert any(f"<td>n{i}</td>" in worst for i in (1, 2, 3)), worst[:2000]
