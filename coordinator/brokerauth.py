"""How the coordinator changes broker logins without importing a broker package.

The composition root (``meshfl coordinator serve``) passes an implementation to
``create_app(..., broker_accounts=...)``: for Mosquitto, ``broker.passwords`` edits the
password file and asks the broker to reload it. ``None`` (the default): the coordinator
manages no broker logins and enrolment returns no broker password.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["BrokerAccounts"]


class BrokerAccounts(Protocol):
    """A broker's login table, keyed by MQTT username (a device id)."""

    def add(self, username: str, password: str) -> None:
        """Create or replace the login ``username`` with ``password``; takes effect at once.

        Raises
        ------
        meshfl.errors.ConfigError
            The broker's password file cannot be written or the broker cannot reload it.

        """
        ...

    def remove(self, username: str) -> None:
        """Delete the login ``username`` (no error if absent); takes effect at once.

        Raises
        ------
        meshfl.errors.ConfigError
            As for :meth:`add`.

        """
        ...
