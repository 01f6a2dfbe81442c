"""The agent's side of secure aggregation (Bonawitz et al., CCS 2017): keys and shares.

:mod:`edge_agent.secagg.crypto` holds the key material (identity, per-job keys, key
bundles) and the primitives (sealing, mask seeds, Shamir shares);
:mod:`edge_agent.secagg.holder` what a device holds for its neighbours and its refusal
policy. The masking arithmetic is in :mod:`meshfl.aggregation` (numpy only). Import
from the modules: the package re-exports nothing.
"""
