"""``meshfl local --secure``: the run's own Mosquitto with TLS, per-device logins and an ACL.

Instead of the embedded (anonymous, plain-TCP) broker, a secure local run writes a fleet
broker into ``OUT/broker`` with :func:`broker.secure.write_secure_broker` and starts
Mosquitto on it (:class:`broker.mosquitto.MosquittoProcess`)::

    OUT/broker/mosquitto.conf  TLS-only listener on 127.0.0.1, allow_anonymous false
    OUT/broker/acl             the fleet's ACL: a device writes only its own topics
    OUT/broker/passwd          logins: the coordinator's and one per enrolled device
    OUT/broker/tls/            development CA, broker and coordinator certificates (broker.tls)
    OUT/broker/mosquitto.log   the broker's log (connections, refusals)

The coordinator serves HTTPS (``--tls-cert``/``--tls-key``, a certificate from the same
CA; agents and the run's operator client pin that CA with ``--coordinator-ca``) and is
started with ``--broker-password-file``, ``--broker-pid-file`` and
``--broker-ca-file``: it writes its own login (a new random password) into the password
file, reloads Mosquitto, and publishes the control topic over TLS; each agent's
enrolment creates that device's login and hands it the CA, so agents connect with
``mqtts://`` and their own username and password. Jobs sign every envelope (Ed25519,
``signed_deltas``), and receivers count what they refuse: the report's ``security``
section sums those counters. Nothing is re-used from a previous run in the same
``OUT``: the broker directory is written anew (old logins must not stay valid).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshfl.errors import ConfigError, MeshflError

if TYPE_CHECKING:
    from broker.mosquitto import MosquittoProcess
    from meshfl.app.local.admin import AdminClient
    from meshfl.app.local.config import LocalConfig

__all__ = [
    "FLEET",
    "REJECTIONS",
    "SECURITY_LINE",
    "SecureBroker",
    "check_secure_options",
    "rejection_totals",
    "start_secure_broker",
]

FLEET = "local"
"""The fleet id of a secure local run (the ACL's topics are ``meshfl/v1/local/...``)."""

SECURITY_LINE = (
    "security on: TLS to the broker and HTTPS to the coordinator (one development CA that"
    " agents pin), a broker login per device,"
    " the fleet's ACL (a device writes only its own topics), signed deltas (Ed25519)"
)
"""What ``meshfl local --secure`` prints once its broker is up."""

REJECTIONS = ("rejected_unsigned", "rejected_signature", "rejected_replayed")
"""The round-metrics counters of refused envelopes (see ``RoundMetrics``)."""


def check_secure_options(config: LocalConfig) -> None:
    """Refuse options that cannot run with ``--secure``.

    Raises
    ------
    meshfl.errors.ConfigError
        ``--broker`` (a secure run starts its own Mosquitto) or ``--link`` (the shaping
        proxies relay plain TCP to a plain broker).

    """
    if not config.secure:
        return
    if config.broker is not None:
        raise ConfigError(
            "--secure starts its own Mosquitto with TLS and logins: drop --broker, or drop"
            " --secure to use your broker"
        )
    if config.links:
        raise ConfigError(
            "--link shapes plain-TCP broker connections and --secure allows only TLS: use one"
            " of them"
        )


@dataclass
class SecureBroker:
    """A running secure Mosquitto of a local run and the coordinator's options for it.

    Attributes
    ----------
    process : MosquittoProcess
        The broker process (TLS listener on 127.0.0.1, logins, the fleet's ACL).

    """

    process: MosquittoProcess

    @property
    def url(self) -> str:
        """``mqtts://127.0.0.1:PORT``."""
        return self.process.url

    @property
    def directory(self) -> Path:
        """``OUT/broker``: config, ACL, password file, TLS material, log."""
        return self.process.workdir

    @property
    def log_path(self) -> Path:
        """Mosquitto's log file."""
        return self.process.log_path

    @property
    def ca_file(self) -> Path:
        """The development CA (PEM) of the broker's and the coordinator's certificates."""
        files = self.process.secure_files
        assert files is not None  # set by MosquittoProcess.start with fleet=
        return files.tls.ca_cert

    def coordinator_args(self) -> list[str]:
        """``meshfl coordinator serve`` options: HTTPS, manage logins, trust the CA, the fleet.

        The coordinator's HTTPS certificate (``tls/coordinator.crt``, for 127.0.0.1 and
        localhost) is issued by the broker's development CA, so agents pin one CA
        (``--coordinator-ca``, :attr:`ca_file`) for both.
        """
        from broker.tls import DEFAULT_HOSTS, write_tls_dir

        files = self.process.secure_files
        assert files is not None  # set by MosquittoProcess.start with fleet=
        tls = write_tls_dir(files.tls.ca_cert.parent, DEFAULT_HOSTS, server="coordinator")
        return [
            "--fleet", FLEET,
            "--broker-password-file", str(files.password_file),
            "--broker-pid-file", str(self.process.pid_path),
            "--broker-ca-file", str(files.tls.ca_cert),
            "--tls-cert", str(tls.server_cert), "--tls-key", str(tls.server_key),
        ]  # fmt: skip

    def check(self) -> None:
        """Raise MeshflError naming the broker when Mosquitto has exited.

        Raises
        ------
        meshfl.errors.MeshflError
            Mosquitto is no longer running; the message quotes the last line of its log.

        """
        if not self.process.running:
            raise MeshflError(f"the Mosquitto broker exited unexpectedly: {self._last_line()}")

    def stop(self) -> None:
        """Stop Mosquitto (SIGTERM, then SIGKILL after 5 s)."""
        self.process.stop()

    def _last_line(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log written"
        return lines[-1] if lines else "empty log"


def start_secure_broker(out: Path, start_timeout_s: float = 30.0) -> SecureBroker:
    """Write a fleet broker into ``out/broker`` (anew) and start Mosquitto on a free port.

    Parameters
    ----------
    out : Path
        The run's output directory.
    start_timeout_s : float, default 30.0
        Seconds to wait for Mosquitto to listen and log that it runs.

    Returns
    -------
    SecureBroker
        The running broker; the caller stops it.

    Raises
    ------
    meshfl.errors.ConfigError
        Mosquitto is not installed (the message names ``apt-get install mosquitto``), or
        ``out/broker`` cannot be written.
    meshfl.errors.MeshflError
        Mosquitto did not start (the message quotes its log).

    """
    from broker.mosquitto import MosquittoProcess, find_mosquitto

    try:
        find_mosquitto()
    except ConfigError:
        raise ConfigError(
            "--secure runs Mosquitto, which is not installed: install it with `apt-get"
            " install mosquitto` (Debian/Ubuntu) or `brew install mosquitto`"
        ) from None
    workdir = (out / "broker").resolve()
    try:
        if workdir.exists():
            shutil.rmtree(workdir)
        workdir.mkdir(parents=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot write the broker files in {workdir} ({exc.strerror}); check --out"
        ) from None
    process = MosquittoProcess(workdir=workdir, start_timeout_s=start_timeout_s, fleet=FLEET)
    try:
        process.start()
    except ConfigError:
        raise
    except MeshflError as exc:
        raise MeshflError(f"the Mosquitto broker failed to start: {exc}") from None
    return SecureBroker(process)


def rejection_totals(admin: AdminClient, job_id: str, device_ids: list[str]) -> dict[str, Any]:
    """Sum the devices' refused-envelope counters over every round they reported.

    Parameters
    ----------
    admin : AdminClient
        The run's operator client.
    job_id : str
        The job.
    device_ids : list of str
        Its participants.

    Returns
    -------
    dict
        ``{"unsigned": n, "bad_signature": n, "replayed": n, "rounds_counted": n}``:
        envelopes refused as unsigned, mis-signed (or from a sender without a key) and
        replayed, summed over devices and rounds; ``rounds_counted`` is the number of
        round reports that carried the counters (0: the job was not signed).

    Raises
    ------
    meshfl.errors.MeshflError
        The coordinator could not be read.

    """
    totals = dict.fromkeys(REJECTIONS, 0)
    counted = 0
    for device_id in device_ids:
        for metrics in admin.device_metrics(job_id, device_id):
            row: dict[str, Any] = dict(metrics)
            if all(key in row for key in REJECTIONS):
                counted += 1
            for key in REJECTIONS:
                totals[key] += int(row.get(key, 0))
    return {
        "unsigned": totals["rejected_unsigned"],
        "bad_signature": totals["rejected_signature"],
        "replayed": totals["rejected_replayed"],
        "rounds_counted": counted,
    }
