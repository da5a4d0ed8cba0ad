"""Kopf logs in with Elastra's credentials: the same identity, renewed before it expires and
after the server refused it (every login after the first)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf

from elastra.controller.engine.operator import _register_login
from elastra.kube.config import Connection
from elastra.kube.credentials import REFRESH_MARGIN, Identity

EXPIRES = datetime(2026, 1, 1, 13, 0, tzinfo=UTC)


@dataclass
class Renewing:
    """Credentials that hand out a new token after each invalidate."""

    generation: int = 1

    def identity(self) -> Identity:
        return Identity(token=f"token-{self.generation}", expires=EXPIRES)

    def invalidate(self) -> None:
        self.generation += 1


def login_handler(connection: Connection) -> Any:
    registry = kopf.OperatorRegistry()
    _register_login(registry, connection)
    (handler,) = registry._activities.get_all_handlers()
    return handler.fn


def test_kopf_login_uses_and_renews_elastras_identity() -> None:
    credentials = Renewing()
    connection = Connection(
        server="https://api:6443", credentials=credentials, ca_pem=b"CA", namespace="ns"
    )
    login = login_handler(connection)
    first: kopf.ConnectionInfo = login()
    assert (first.server, first.token, first.ca_data) == ("https://api:6443", "token-1", b"CA")
    assert first.default_namespace == "ns"
    assert first.expiration == EXPIRES - REFRESH_MARGIN  # Kopf asks again before it dies
    second: kopf.ConnectionInfo = login()  # Kopf got a 401 or the token aged out
    assert second.token == "token-2"
