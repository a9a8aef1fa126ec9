"""AccessControl: the edge's authentication and authorization settings, shared by every
connection: the password file and anonymous policy (services/edge/auth.py), the ACL
(services/edge/acl.py) and the enhanced authentication methods (services/edge/enhanced_auth.py)."""

from __future__ import annotations

from pathlib import Path

from hexmq.mqtt.reason_codes import ReasonCode
from services.edge.acl import Acl, ClientAcl
from services.edge.auth import PasswordFile
from services.edge.enhanced_auth import AuthMethods


class AccessControl:
    """The edge's authentication and authorization settings, shared by every connection."""

    def __init__(
        self,
        passwords: PasswordFile | None = None,
        *,
        allow_anonymous: bool = True,
        acl: Acl | None = None,
        methods: AuthMethods | None = None,
        acl_path: Path | None = None,
        client_ids: ClientIdRules | None = None,
    ) -> None:
        self.passwords = passwords
        self.allow_anonymous = allow_anonymous
        self.acl = acl
        # The ACL file, read again on SIGHUP (reload_acl); each reload raises the generation,
        # and every connection's rules follow at its next check (services/edge/acl.py).
        self.acl_path = acl_path
        self.acl_generation = 0
        # --use-username-as-clientid, --clientid-prefixes.
        self.client_ids = client_ids or ClientIdRules()
        # Enhanced authentication methods (MQTT 5.0 4.12) offered to CONNECTs naming one.
        self.methods = methods if methods is not None else AuthMethods()

    def authenticate(self, username: str | None, password: bytes | None) -> tuple[int, str]:
        """(0, "") to let a CONNECT in, else (CONNACK reason code, why for the log).

        Without a password file a user name is taken as given (it still selects ACL rules)."""
        if username is None:
            if self.allow_anonymous:
                return 0, ""
            return ReasonCode.NOT_AUTHORIZED, "anonymous clients are not allowed"
        if self.passwords is None:
            return 0, ""
        if password is None or not self.passwords.verify(username, password):
            return ReasonCode.BAD_USER_NAME_OR_PASSWORD, f"bad user name or password ({username!r})"
        return 0, ""

    def client_acl(self, client_id: str, username: str | None) -> ClientAcl | None:
        """A connection's rules (None without an ACL: everything is allowed), following
        reloads of the ACL."""
        if self.acl is None:
            return None
        return self.acl.for_client(client_id, username, self)

    def reload_acl(self) -> Acl | None:
        """Read the ACL file again (SIGHUP, as mosquitto does). A file that does not parse
        raises ValueError and the ACL in force stays."""
        if self.acl_path is None:
            return None
        acl = Acl.load(self.acl_path)
        self.acl = acl
        self.acl_generation += 1
        return acl

    def may_publish_will(self, client_id: str, username: str | None, topic: str) -> str | None:
        """Why a client may not have a will on `topic` (None: it may): a will is a PUBLISH of
        its client, so the rules of PUBLISH apply (only the broker publishes under $SYS/, and
        the ACL's write rule)."""
        if topic.startswith("$SYS/"):
            return "only the broker publishes under $SYS/"
        acl = self.acl
        if acl is not None and not acl.for_client(client_id, username).may_publish(topic):
            return "the ACL denies publishing to this topic"
        return None


class ClientIdRules:
    """Which client ids a user may take (issue 25: one user must not resume another's session).

    `use_username`: the client id is the user name (mosquitto's use_username_as_clientid); a
    client without a user name is refused. `prefixes`: the client id must start with one of
    them (mosquitto's clientid_prefixes), `%u` standing for the user name (so `%u-` gives
    every user the ids starting with its name and a dash); a client without a user name only
    gets prefixes without `%u`. `%u` must be followed by a separator (the character after it),
    and a user name holding that separator cannot use the prefix."""

    def __init__(self, *, use_username: bool = False, prefixes: tuple[str, ...] = ()) -> None:
        for prefix in prefixes:
            at = prefix.find("%u")
            if not prefix or (at >= 0 and (at + 2 >= len(prefix) or prefix.count("%u") > 1)):
                raise ValueError(
                    f"--clientid-prefixes: {prefix!r}: a prefix is not empty, and %u (once) "
                    "is followed by a separator, e.g. %u- or %u/"
                )
        self.use_username = use_username
        self.prefixes = prefixes

    @property
    def active(self) -> bool:
        return self.use_username or bool(self.prefixes)

    def client_id(self, client_id: str, username: str | None) -> tuple[str | None, str]:
        """(the client id to use, "") or (None, why it is refused)."""
        if self.use_username:
            if username is None:
                return None, "a user name is needed (--use-username-as-clientid)"
            client_id = username
        if self.prefixes:
            for prefix in self.prefixes:
                at = prefix.find("%u")
                if at >= 0:
                    # The character after %u ends the user name: a user name holding it
                    # could reach into another user's ids ("a" + "-" covers "a-b-...").
                    if username is None or prefix[at + 2] in username:
                        continue
                    prefix = prefix.replace("%u", username)
                if client_id.startswith(prefix):
                    return client_id, ""
            return None, "the client id does not start with a prefix this user may use"
        return client_id, ""
