"""meshfl: decentralized, compressed, private federated learning over MQTT.

The ``meshfl`` package is the shared kernel (numpy and the standard library only): the
wire format (:mod:`meshfl.wire`), codecs (:mod:`meshfl.codecs`), topologies and mixing
matrices (:mod:`meshfl.topology`), gossip algorithms (:mod:`meshfl.aggregation`), the
REST contract (:mod:`meshfl.contract`) and the error tree (:mod:`meshfl.errors`).
:mod:`meshfl.app.cli` and :mod:`meshfl.app.local` are the composition root.
"""

from meshfl.errors import MeshflError

__all__ = ["MeshflError", "__version__"]

__version__ = "0.1.0"
