"""AccessControl: the edge's authentication and authorization settings, shared by every
connection: the password file and anonymous policy (services/edge/auth.py), the ACL
(services/edge/acl.py) and the enhanced authentication methods (services/edge/enhanced_auth.py)."""

from __future__ import annotations

from hexmq.mqtt.reason_codes import ReasonCode
from services.edge.acl import Acl
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
    ) -> None:
        self.passwords = passwords
        self.allow_anonymous = allow_anonymous
        self.acl = acl
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
