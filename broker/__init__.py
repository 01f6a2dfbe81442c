"""MQTT brokers for meshfl: the embedded amqtt broker and the project's Mosquitto config.

The embedded broker (:class:`broker.embedded.EmbeddedBroker`) is the one-machine default
and speaks MQTT 3.1.1 only; Mosquitto (:mod:`broker.mosquitto`) is the production broker
and speaks MQTT 5. Submodules are imported lazily by their users so that importing
``broker`` does not pull amqtt in.
"""

__all__: list[str] = []
