"""The meshfl edge agent: daemon, MQTT transport, gossip round engine and trainer."""

__all__: list[str] = []
