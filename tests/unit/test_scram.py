"""The SCRAM server (services/edge/scram.py) against the RFCs' example exchanges and the
password files mosquitto_passwd writes; and the enhanced authentication interface that runs
it (services/edge/enhanced_auth.py): the per-connection checks and the plugin loader."""

from __future__ import annotations

import base64
import hashlib
import hmac
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from hexmq.mqtt import Auth, Properties, ProtocolError
from services.edge.auth import SCRAM_SHA512, PasswordFile, parse_hash, scram_entry
from services.edge.enhanced_auth import (
    AuthMethods,
    ConnectionAuth,
    Continue,
    Failure,
    PluginContext,
    Step,
    Success,
    load_plugin,
)
from services.edge.passwd import main as passwd_main
from services.edge.scram import NAME, ScramExchange, ScramKeys, ScramSha512
from tests.support.access import MOSQUITTO_FILE
from tests.support.scram import ScramClient


class RfcExample(NamedTuple):
    """An example exchange of an RFC: user "user", password "pencil", 4096 iterations."""

    hash_name: str
    salt: str
    client_nonce: str
    server_nonce: str
    client_final: str
    server_final: str

    @property
    def client_first(self) -> bytes:
        return f"n,,n=user,r={self.client_nonce}".encode()

    @property
    def server_first(self) -> bytes:
        return f"r={self.client_nonce}{self.server_nonce},s={self.salt},i=4096".encode()


# RFC 5802 section 5 (SCRAM-SHA-1) and RFC 7677 section 3 (SCRAM-SHA-256), message by message.
RFC_EXAMPLES = [
    pytest.param(
        RfcExample(
            "sha1",
            "QSXCR+Q6sek8bf92",
            "fyko+d2lbbFgONRv9qkxdawL",
            "3rfcNHYJY1ZVvWVs7j",
            "c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=",
            "v=rmF9pqV8S7suAoZWja4dJRkFsKQ=",
        ),
        id="rfc5802-sha1",
    ),
    pytest.param(
        RfcExample(
            "sha256",
            "W22ZaJ0SNY7soEsUEjb6gQ==",
            "rOprNGfwEbeRWgbNEkqO",
            "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
            "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
            "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=",
        ),
        id="rfc7677-sha256",
    ),
]


@pytest.mark.parametrize("rfc", RFC_EXAMPLES)
def test_server_reproduces_the_rfc_examples(rfc: RfcExample) -> None:
    salt = base64.b64decode(rfc.salt)
    size = hashlib.new(rfc.hash_name).digest_size
    salted = hashlib.pbkdf2_hmac(rfc.hash_name, b"pencil", salt, 4096, size)
    keys = ScramKeys.from_salted_password(rfc.hash_name, salted, salt, 4096)
    server = ScramExchange(rfc.hash_name, lambda user: (keys, None), lambda: rfc.server_nonce)
    assert server.step(rfc.client_first) == Continue(rfc.server_first)
    assert server.step(rfc.client_final.encode()) == Success("user", rfc.server_final.encode())


@pytest.mark.parametrize("rfc", RFC_EXAMPLES)
def test_test_client_reproduces_the_rfc_examples(rfc: RfcExample) -> None:
    # The integration tests' client, checked against the same examples.
    client = ScramClient("user", "pencil", hash_name=rfc.hash_name, nonce=rfc.client_nonce)
    assert client.first() == rfc.client_first
    assert client.final(rfc.server_first) == rfc.client_final.encode()
    client.verify(rfc.server_final.encode())


def test_a_mosquitto_7_entry_is_scram_sha_512_salted_password() -> None:
    # The claim SCRAM-SHA-512 over the password file rests on: mosquitto_passwd's $7$ hash is
    # Hi(password, salt, i) of RFC 5802 with HMAC-SHA-512, i.e. PBKDF2 with a 64-byte output.
    entry = parse_hash(MOSQUITTO_FILE.splitlines()[0].partition(":")[2])
    assert (entry.scheme, entry.iterations, len(entry.digest)) == (7, 101, 64)
    assert hashlib.pbkdf2_hmac("sha512", b"secret", entry.salt, 101) == entry.digest


def exchange(method: ScramSha512, client: ScramClient, *, password: str | None = None) -> Step:
    ex = method.exchange(client_id="c1", peer="127.0.0.1:1")
    first = ex.step(client.first())
    assert isinstance(first, Continue)
    return ex.step(client.final(first.data, password=password))


@pytest.fixture
def mosquitto_users() -> ScramSha512:
    # $7$ lines serve SCRAM only when the operator says so (--scram-from-pbkdf2, insecure).
    return ScramSha512(PasswordFile.parse(MOSQUITTO_FILE, "pw"), from_pbkdf2=True)


def test_scram_sha_512_against_a_mosquitto_passwd_entry(mosquitto_users: ScramSha512) -> None:
    client = ScramClient("alice", "secret")
    step = exchange(mosquitto_users, client)
    assert isinstance(step, Success)
    assert step.username == "alice"
    client.verify(step.data)


def test_nonces_differ_per_exchange(mosquitto_users: ScramSha512) -> None:
    seen = set()
    for _ in range(3):
        step = mosquitto_users.exchange(client_id="c", peer="p").step(b"n,,n=alice,r=abc")
        assert isinstance(step, Continue)
        seen.add(step.data)
    assert len(seen) == 3


@pytest.mark.parametrize(
    ("user", "password", "logged"),
    [
        ("alice", "Secret", "wrong password"),
        ("mallory", "secret", "unknown user"),
        ("bob", "s2", "$6$ entry"),  # bob's right password, but a $6$ line cannot serve SCRAM
    ],
)
def test_failures_look_alike_to_the_client(
    mosquitto_users: ScramSha512, user: str, password: str, logged: str
) -> None:
    step = exchange(mosquitto_users, ScramClient(user, "unused"), password=password)
    assert isinstance(step, Failure)
    assert (step.reason_code, step.reason, step.data) == (
        0x87,
        "authentication failed",
        b"e=invalid-proof",
    )
    assert logged in step.log


def test_an_unknown_users_salt_is_stable_and_looks_real(mosquitto_users: ScramSha512) -> None:
    def server_first(method: ScramSha512, user: str) -> dict[str, str]:
        step = method.exchange(client_id="c", peer="p").step(f"n,,n={user},r=x".encode())
        assert isinstance(step, Continue)
        return dict(a.split("=", 1) for a in step.data.decode().split(","))

    # another edge, same file
    again = ScramSha512(PasswordFile.parse(MOSQUITTO_FILE, "pw"), from_pbkdf2=True)
    unknown = server_first(mosquitto_users, "mallory")
    assert unknown["s"] == server_first(again, "mallory")["s"]
    assert unknown["s"] != server_first(mosquitto_users, "mallet")["s"]
    real = server_first(mosquitto_users, "alice")
    assert unknown["i"] == real["i"] == "101"
    assert len(base64.b64decode(unknown["s"])) == len(base64.b64decode(real["s"])) == 12


@pytest.mark.parametrize(
    ("client_first", "error"),
    [
        (b"n,,n=alice", "invalid-encoding"),  # no nonce
        (b"n=alice,r=abc", "invalid-encoding"),  # no GS2 header
        (b"p=tls-unique,,n=alice,r=abc", "channel-binding-not-supported"),
        (b"x,,n=alice,r=abc", "invalid-encoding"),
        (b"n,,m=ext,n=alice,r=abc", "extensions-not-supported"),
        (b"n,,n=al=1ce,r=abc", "invalid-username-encoding"),
        (b"n,a=bob,n=alice,r=abc", "invalid-username-encoding"),
        (b"n,,n=alice,r=abc\xff", "invalid-encoding"),
    ],
)
def test_bad_client_first_messages_fail(
    mosquitto_users: ScramSha512, client_first: bytes, error: str
) -> None:
    step = mosquitto_users.exchange(client_id="c", peer="p").step(client_first)
    assert isinstance(step, Failure)
    assert (step.reason_code, step.data) == (0x87, f"e={error}".encode())


def test_no_authentication_data_fails(mosquitto_users: ScramSha512) -> None:
    step = mosquitto_users.exchange(client_id="c", peer="p").step(None)
    assert isinstance(step, Failure)
    assert "no Authentication Data" in step.log


def test_escaped_names_and_a_matching_authzid_are_accepted() -> None:
    users = PasswordFile.parse("a,b=c:" + scram_entry("secret", iterations=64), "pw")
    method = ScramSha512(users)
    client = ScramClient("a,b=c", "secret", gs2_header="y,a=a=2Cb=3Dc,")
    step = exchange(method, client)
    assert isinstance(step, Success)
    assert step.username == "a,b=c"
    client.verify(step.data)


@pytest.mark.parametrize(
    ("tamper", "error"),
    [
        (lambda f: f.replace(b"c=biws", b"c=eSws"), "channel-bindings-dont-match"),
        (lambda f: f.replace(b",r=", b",r=X"), "other-error"),  # another nonce
        (lambda f: f[: f.index(b",p=")], "invalid-encoding"),  # no proof
        (lambda f: f[: f.index(b",p=") + 3] + b"AAAA", "invalid-proof"),  # short proof
        (lambda f: f[: f.index(b",p=") + 3] + b"!!", "invalid-encoding"),
    ],
)
def test_bad_client_final_messages_fail(mosquitto_users: ScramSha512, tamper, error) -> None:
    client = ScramClient("alice", "secret")
    ex = mosquitto_users.exchange(client_id="c", peer="p")
    first = ex.step(client.first())
    assert isinstance(first, Continue)
    step = ex.step(tamper(client.final(first.data)))
    assert isinstance(step, Failure)
    assert step.data == f"e={error}".encode()
    # The exchange is over: a further step fails too.
    assert isinstance(ex.step(b"anything"), Failure)


# ----- the per-connection driver ------------------------------------------------------------


class Scripted:
    """A method whose exchanges answer from a script (and can misbehave)."""

    name = "SCRIPTED"

    def __init__(self, *steps: object) -> None:
        self.steps = list(steps)
        self.seen: list[bytes | None] = []

    def exchange(self, *, client_id: str, peer: str) -> Scripted:
        return self

    def step(self, data: bytes | None) -> Step:
        self.seen.append(data)
        step = self.steps.pop(0)
        if isinstance(step, Exception):
            raise step
        return step


def auth(code: int, data: bytes = b"", method: str = "SCRIPTED") -> Auth:
    return Auth(code, Properties(authentication_method=method, authentication_data=data))


def test_connection_auth_runs_connect_then_reauthentication() -> None:
    method = Scripted(Continue(b"c1"), Success("alice", b"f1"), Continue(b"c2"), Success("alice"))
    conn = ConnectionAuth(method, client_id="c", peer="p")
    assert conn.start(b"d0") == Continue(b"c1")
    assert conn.in_progress
    assert conn.receive(auth(0x18, b"d1"), connected=False) == Success("alice", b"f1")
    assert conn.username == "alice"
    assert not conn.in_progress
    assert conn.receive(auth(0x19, b"d2"), connected=True) == Continue(b"c2")
    assert conn.receive(auth(0x18, b"d3"), connected=True) == Success("alice")
    assert method.seen == [b"d0", b"d1", b"d2", b"d3"]


@pytest.mark.parametrize(
    ("packet", "connected", "in_progress", "says"),
    [
        (auth(0x18, method="OTHER"), False, True, "MQTT-4.12.0-5"),
        (auth(0x19), False, True, "MQTT-4.12.0-3"),  # 0x19 in the CONNECT exchange
        (auth(0x19), True, True, "MQTT-4.12.0-3"),  # 0x19 during a re-authentication
        (auth(0x18), True, False, "MQTT-4.12.1-1"),  # 0x18 with no exchange under way
        (Auth(0x00, Properties(authentication_method="SCRIPTED")), True, False, "4.12.1-1"),
    ],
)
def test_auth_breaking_the_exchange_rules_is_a_protocol_error(
    packet: Auth, connected: bool, in_progress: bool, says: str
) -> None:
    conn = ConnectionAuth(Scripted(Continue(b"c"), Success("alice")), client_id="c", peer="p")
    conn.start(b"")
    if not in_progress:
        conn.receive(auth(0x18), connected=False)  # the exchange in CONNECT succeeds
    with pytest.raises(ProtocolError) as raised:
        conn.receive(packet, connected=connected)
    assert raised.value.reason_code == 0x82
    assert says in raised.value.message


@pytest.mark.parametrize(
    ("bad", "code"),
    [
        (RuntimeError("boom"), 0x80),
        ("not a step", 0x80),
        (Continue("str, not bytes"), 0x80),
        (Success(""), 0x80),
        (Failure(0x18, "not a failing code"), 0x87),
        (Failure(0x8E, "0x8E is a DISCONNECT code, not a CONNACK one"), 0x87),
    ],
)
def test_a_misbehaving_method_fails_the_client_cleanly(bad: object, code: int) -> None:
    conn = ConnectionAuth(Scripted(bad), client_id="c", peer="p")
    step = conn.start(b"")
    assert isinstance(step, Failure)
    assert step.reason_code == code
    assert not conn.in_progress


def test_reauthentication_as_another_user_fails() -> None:
    method = Scripted(Success("alice"), Success("mallory"))
    conn = ConnectionAuth(method, client_id="c", peer="p")
    assert conn.start(b"") == Success("alice")
    step = conn.receive(auth(0x19), connected=True)
    assert isinstance(step, Failure)
    assert step.reason_code == 0x87
    assert conn.username == "alice"


# ----- the methods an edge offers -----------------------------------------------------------


@pytest.fixture
def plugin_module() -> Iterator[str]:
    module = types.ModuleType("hexmq_test_auth_plugin")
    module.make = lambda context: Scripted(Success(context.node_id))
    module.broken = lambda context: 42
    module.fails = lambda context: 1 / 0
    module.constant = "not callable"
    sys.modules[module.__name__] = module
    yield module.__name__
    del sys.modules[module.__name__]


CONTEXT = PluginContext(node_id="n7", passwords=PasswordFile.parse(MOSQUITTO_FILE, "pw"))


def test_a_plugin_is_loaded_from_an_import_path(plugin_module: str) -> None:
    methods = AuthMethods.build(
        {NAME: ScramSha512.from_context}, [NAME], [f"{plugin_module}:make"], CONTEXT
    )
    assert methods.names == [NAME, "SCRIPTED"]
    plugin = methods.get("SCRIPTED")
    assert plugin is not None
    assert plugin.exchange(client_id="c", peer="p").step(None) == Success("n7")
    assert "SCRAM-SHA-1" in methods.why_refused("SCRAM-SHA-1")
    assert AuthMethods().why_refused("X") == "no authentication method is configured"


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("no_colon", "expected MODULE:FACTORY"),
        ("hexmq_no_such_module_xyz:make", "cannot import"),
        ("{m}:missing", "no callable missing"),
        ("{m}:constant", "no callable constant"),
        ("{m}:broken", "must return an object with a `name`"),
        ("{m}:fails", "fails() failed: ZeroDivisionError"),
    ],
)
def test_a_bad_plugin_is_refused_at_startup_naming_it(
    plugin_module: str, spec: str, says: str
) -> None:
    spec = spec.format(m=plugin_module)
    with pytest.raises(ValueError, match="--auth-plugin") as raised:
        load_plugin(spec, CONTEXT)
    assert says in str(raised.value)


def test_method_configuration_errors(plugin_module: str) -> None:
    builtin = {NAME: ScramSha512.from_context}
    with pytest.raises(ValueError, match="needs --password-file"):
        AuthMethods.build(builtin, [NAME], [], PluginContext("n1", None))
    with pytest.raises(ValueError, match="unknown authentication method 'SCRAM-SHA-1'"):
        AuthMethods.build(builtin, ["SCRAM-SHA-1"], [], CONTEXT)
    with pytest.raises(ValueError, match="configured twice"):
        AuthMethods.build(builtin, [], [f"{plugin_module}:make"] * 2, CONTEXT)


# ----- SCRAM credentials that are not passwords (issue 25) -------------------------------------


def attacker_final(server_first: bytes, client: ScramClient, salted: bytes) -> bytes:
    """A client-final-message from someone who holds `salted` as SaltedPassword (a file's
    hash) instead of the password."""
    text = server_first.decode()
    nonce = dict(part.split("=", 1) for part in text.split(","))["r"]
    client_key = hmac.digest(salted, b"Client Key", "sha512")
    stored_key = hashlib.sha512(client_key).digest()
    without_proof = f"c=biws,r={nonce}"
    auth_message = f"{client.client_first_bare},{text},{without_proof}".encode()
    signature = hmac.digest(stored_key, auth_message, "sha512")
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def login_with_hash(method: ScramSha512, user: str, salted: bytes) -> Step:
    client = ScramClient(user, "unknown")
    ex = method.exchange(client_id="c1", peer="127.0.0.1:1")
    first = ex.step(client.first())
    assert isinstance(first, Continue)
    return ex.step(attacker_final(first.data, client, salted))


def test_a_7_hash_alone_logs_in_only_with_scram_from_pbkdf2() -> None:
    # The password file's $7$ hash is SCRAM's SaltedPassword: with it alone (no password) a
    # client can compute a valid proof. So $7$ entries serve SCRAM only when asked for.
    users = PasswordFile.parse(MOSQUITTO_FILE, "pw")
    salted = users.users["alice"].digest
    refused = login_with_hash(ScramSha512(users), "alice", salted)
    assert isinstance(refused, Failure)
    assert "does not serve SCRAM-SHA-512" in refused.log
    insecure = login_with_hash(ScramSha512(users, from_pbkdf2=True), "alice", salted)
    assert isinstance(insecure, Success)


def test_a_scram_entry_serves_scram_and_connect_passwords() -> None:
    users = PasswordFile.parse(f"alice:{scram_entry('secret')}\n", "pw")
    entry = users.users["alice"]
    assert (entry.scheme, entry.iterations, len(entry.digest), len(entry.server_key)) == (
        SCRAM_SHA512,
        4096,
        64,
        64,
    )
    client = ScramClient("alice", "secret")
    step = exchange(ScramSha512(users), client)
    assert isinstance(step, Success)
    client.verify(step.data)
    assert users.verify("alice", b"secret")
    assert not users.verify("alice", b"Secret")
    assert isinstance(exchange(ScramSha512(users), client, password="Secret"), Failure)


def test_reading_a_scram_entry_gives_no_login() -> None:
    # Whoever reads the file has the salt, StoredKey and ServerKey; none of them, used as
    # SaltedPassword or as ClientKey, makes a proof the server takes.
    users = PasswordFile.parse(f"alice:{scram_entry('secret')}\n", "pw")
    entry = users.users["alice"]
    method = ScramSha512(users)
    for guess in (entry.digest, entry.server_key):
        assert isinstance(login_with_hash(method, "alice", guess), Failure)
    client = ScramClient("alice", "x")
    ex = method.exchange(client_id="c1", peer="p")
    first = ex.step(client.first())
    assert isinstance(first, Continue)
    nonce = dict(a.split("=", 1) for a in first.data.decode().split(","))["r"]
    without_proof = f"c=biws,r={nonce}"
    auth = f"{client.client_first_bare},{first.data.decode()},{without_proof}".encode()
    # StoredKey taken for ClientKey: the server hashes the recovered key and compares.
    signature = hmac.digest(entry.digest, auth, "sha512")
    proof = bytes(a ^ b for a, b in zip(entry.digest, signature, strict=True))
    final = f"{without_proof},p={base64.b64encode(proof).decode()}".encode()
    assert isinstance(ex.step(final), Failure)


def test_hexmq_passwd_scram_writes_a_scram_entry(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    assert passwd_main([str(path), "alice", "a-pw"]) == 0
    assert passwd_main(["--scram", str(path), "bob", "b-pw"]) == 0
    text = path.read_text()
    assert "alice:$7$101$" in text
    assert "bob:SCRAM-SHA-512$4096:" in text
    users = PasswordFile.parse(text, str(path))
    assert users.verify("alice", b"a-pw")
    assert users.verify("bob", b"b-pw")
    method = ScramSha512(users)
    assert isinstance(exchange(method, ScramClient("bob", "b-pw")), Success)
    assert isinstance(exchange(method, ScramClient("alice", "a-pw")), Failure)


def test_a_bad_scram_entry_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="StoredKey and ServerKey"):
        PasswordFile.parse("alice:SCRAM-SHA-512$4096:c2FsdA==$YQ==:Yg==\n", "pw")
    with pytest.raises(ValueError, match="SCRAM-SHA-512\\$ITERATIONS"):
        PasswordFile.parse("alice:SCRAM-SHA-512$4096\n", "pw")
