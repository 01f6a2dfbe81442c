"""The fault-injection lab of ``meshfl local``.

Chaos and shaping proxies, process faults, the lockstep reference fleet and the
Byzantine attacker: test and benchmark machinery that nothing on a device's path
(``meshfl agent run``) imports.
"""
