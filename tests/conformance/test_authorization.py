"""Authorization (--acl-file, mosquitto's format) on a real edge, with the exact PUBACK and
SUBACK codes for MQTT 3.1.1 and 5.0, and the startup error that names the bad line. The edge is
`access_port` (tests/conformance/conftest.py); its rules are tests.support.access.ACL."""

from __future__ import annotations

from pathlib import Path

import pytest

from hexmq.mqtt import PingReq, PingResp, Publish
from tests.support.access import login, uid
from tests.support.edgeproc import run_edge_expecting_failure
from tests.support.rawclient import RawClient


async def still_connected(client: RawClient) -> bool:
    await client.send(PingReq())
    return isinstance(await client.recv(), PingResp)


@pytest.mark.parametrize(("version", "code"), [(5, 0x87), (4, 0)])
async def test_s5_4_2_denied_publish_is_refused_or_dropped(
    access_port: int, version: int, code: int
) -> None:
    """§5.4.2: a PUBLISH the ACL denies is not delivered, and the connection stays.

    5.0: PUBACK 0x87; 3.1.1: acknowledged and dropped (as mosquitto), one of the two answers
    MQTT-3.3.5-2 (3.1.1) allows.
    """
    base = f"t{uid()}"
    watcher, _ = await login(access_port, 5, "admin", "admin-pw")
    await watcher.subscribe(f"{base}/#", f"sensors/{base}/#", qos=1)
    bob, _ = await login(access_port, version, "bob", "bob-pw")
    denied = await bob.publish(f"sensors/{base}/temp", b"read-only for bob", qos=1)
    assert denied is not None
    assert denied.reason_code == code
    assert (await bob.publish(f"{base}/x", b"no rule", qos=1)).reason_code == code
    assert await still_connected(bob)
    alice, _ = await login(access_port, version, "alice", "alice-pw")
    allowed = await alice.publish(f"sensors/{base}/temp", b"ok", qos=1)
    assert allowed is not None
    assert allowed.reason_code == 0
    got = await watcher.expect(Publish)
    assert got.payload == b"ok"  # bob's messages never arrived before it
    for client in (watcher, bob, alice):
        await client.close()


@pytest.mark.parametrize(("version", "code"), [(5, 0x87), (4, 0x80)])
async def test_mqtt_3_8_4_5_denied_subscribe_fails_only_that_filter(
    access_port: int, version: int, code: int
) -> None:
    """MQTT-3.8.4-5: each filter of a SUBSCRIBE is handled on its own: a denied one fails alone.

    5.0: 0x87, 3.1.1: 0x80; a shared filter is authorized by its inner filter. Also
    MQTT-3.8.4-1, -6, -7 and MQTT-3.9.3-1 (one reason code per filter, in order).
    """
    bob, _ = await login(access_port, version, "bob", "bob-pw")
    suback = await bob.subscribe("sensors/+/temp", "sensors/#", "clients/bob/#", "other", qos=1)
    assert suback.reason_codes == (1, code, 1, code)
    # A shared subscription is authorized by its inner filter.
    suback = await bob.subscribe("$share/g/sensors/+/temp", "$share/g/sensors/#", qos=1)
    assert suback.reason_codes == (1, code)
    assert await still_connected(bob)
    await bob.close()


async def test_s5_4_2_deliveries_are_checked_against_read_rules(access_port: int) -> None:
    """§5.4.2: each delivery is checked against the subscriber's read rules.

    alice's `sensors/#` is granted, but `deny sensors/secret/#` still holds per message.
    """
    base = f"sensors/{uid()}"
    alice, _ = await login(access_port, 5, "alice", "alice-pw")
    assert (await alice.subscribe("sensors/#", qos=1)).reason_codes == (1,)
    admin, _ = await login(access_port, 5, "admin", "admin-pw")
    await admin.publish("sensors/secret/key", b"hidden", qos=1)
    await admin.publish(f"{base}/open", b"visible", qos=1)
    got = await alice.expect(Publish)
    assert (got.topic, got.payload) == (f"{base}/open", b"visible")
    with pytest.raises(TimeoutError):
        await alice.recv(timeout=0.5)
    for client in (alice, admin):
        await client.close()


async def test_s5_4_2_patterns_substitute_the_user_name(access_port: int) -> None:
    """§5.4.2: `%u` in an ACL pattern stands for the client's user name."""
    bob, _ = await login(access_port, 5, "bob", "bob-pw")
    own = await bob.publish(f"clients/bob/{uid()}", b"mine", qos=1)
    other = await bob.publish(f"clients/alice/{uid()}", b"not mine", qos=1)
    assert own is not None
    assert other is not None
    assert own.reason_code in (0, 0x10)  # 0x10: no subscribers, but allowed
    assert other.reason_code == 0x87
    await bob.close()


# ----- startup errors ----------------------------------------------------------------------


def test_s5_4_2_bad_acl_line_is_named_at_startup(tmp_path: Path) -> None:
    """§5.4.2: an ACL file the edge cannot read stops it at startup, naming the line."""
    path = tmp_path / "acl"
    path.write_text("user alice\ntopic read a/#\ntopic read a/#/b\n")
    code, stderr = run_edge_expecting_failure([f"--acl-file={path}"])
    assert code == 2
    assert f"ACL file {path}, line 3" in stderr
