"""The users, passwords and ACL of the password- and ACL-protected edge the authentication and
authorization conformance tests connect to (tests/conformance/conftest.py starts it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from hexmq.mqtt import ConnAck, Connect
from services.edge.passwd import set_password
from tests.support.rawclient import RawClient
from tests.support.unique import uid

USERS = {"alice": "alice-pw", "bob": "bob-pw", "admin": "admin-pw"}

ACL = """\
# Clients without a user name: nothing (and they are refused anyway).
user alice
topic readwrite sensors/#
topic deny sensors/secret/#

user bob
topic read sensors/+/temp

user admin
topic readwrite #

pattern readwrite clients/%u/#
"""


def write_passwords(path: Path) -> None:
    """With mosquitto_passwd when it is installed (the format we promise to read), else with
    our own helper."""
    for user, password in USERS.items():
        if shutil.which("mosquitto_passwd"):
            create = [] if path.exists() else ["-c"]
            subprocess.run(
                ["mosquitto_passwd", *create, "-b", str(path), user, password],
                check=True,
                capture_output=True,
                timeout=30,
            )
        else:
            set_password(path, user, password, 101)


async def login(
    port: int, version: int, user: str | None, password: str | None, client_id: str = ""
) -> tuple[RawClient, ConnAck]:
    client = await RawClient.open(port, version)
    await client.send(
        Connect(
            client_id=client_id or f"c-{uid()}",
            protocol_version=version,
            username=user,
            password=password.encode() if password is not None else None,
        )
    )
    return client, await client.expect(ConnAck)


# Written by mosquitto_passwd 2.0: alice/secret ($7$, PBKDF2-SHA512), bob/s2 ($6$, SHA512).
MOSQUITTO_FILE = """\
alice:$7$101$zX4QcmB1UiVl9X7x$z6vSxFohusr3mdMdYn3tK5qXpBvSAhnV6k75lOVOW6TqQxp50fPp2eHdZkD9hID7F9LoIEu6nOkuwrOozZP4Ng==
bob:$6$i/uImPdHFOhD9okO$IndpbCx0N1fzg+Lq6CznzLbyN5WmWuh4C12FMhyLWSkm9JCbcfok5c7UT/W05QVb/jBlIcIIipmRC6NoIiMcTA==
"""
