"""The gossip algorithms a job can name, one module each (``spec["algorithm"]``).

Each module has ``build(assignment, privacy, params, topology)`` returning the device's
:class:`~meshfl.aggregation.GossipAlgorithm`; :data:`edge_agent.engines.ALGORITHMS`
maps the job spec's ``algorithm`` names to them.
"""
