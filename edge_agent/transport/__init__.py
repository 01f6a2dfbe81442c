"""The one seam between the agent and the MQTT broker.

:class:`Transport` is the interface; :class:`MemoryTransport` over a :class:`MemoryBroker`
is its in-memory twin for network-free tests; ``edge_agent.transport.mqtt.MqttTransport``
is the paho-mqtt implementation (imported from its module so that this package does not
import paho).
"""

from edge_agent.transport.base import Handler, Message, Transport
from edge_agent.transport.memory import MemoryBroker, MemoryTransport

__all__ = ["Handler", "MemoryBroker", "MemoryTransport", "Message", "Transport"]
